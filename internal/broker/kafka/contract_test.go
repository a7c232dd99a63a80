package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
)

// The broker contract, on kfake and on the local Apache Kafka.
func TestContract(t *testing.T) {
	caps := brokertest.Capabilities{ReleaseRedeliversAtOnce: false}
	t.Run("kfake", func(t *testing.T) {
		brokertest.Run(t, func(t *testing.T) brokertest.Fixture {
			return kafkaFixture(t, cluster(t, "contract"), "contract")
		}, caps)
	})
	t.Run("apache", func(t *testing.T) {
		brokertest.Run(t, func(t *testing.T) brokertest.Fixture {
			brokers, topic := apacheTopic(t)
			return kafkaFixture(t, brokers, topic)
		}, caps)
	})
}

const contractTier = 500 * time.Millisecond

func kafkaFixture(t *testing.T, brokers []string, topic string) brokertest.Fixture {
	return brokertest.Fixture{
		Tier: contractTier,
		Open: func(t *testing.T) (brokertest.Consumer, brokertest.Transferer, func()) {
			c, err := New(Options{Name: "contract", Brokers: brokers, Topic: topic, Group: topic + "-g",
				Tiers: []time.Duration{contractTier}, Declare: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Declare(context.Background()); err != nil {
				t.Fatal(err)
			}
			return c, c, func() { _ = c.Close() }
		},
		Publish: func(t *testing.T, id string, body []byte, headers map[string]string) {
			r := &kgo.Record{Topic: topic, Value: body, Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}}
			for k, v := range headers {
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
			}
			produce(t, brokers, r)
		},
		DeadLetters: func(t *testing.T) []broker.Message {
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(DeadLetterTopic(topic, topic+"-g")),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			var out []broker.Message
			cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				h := broker.Headers{}
				for _, kv := range r.Headers {
					h[kv.Key] = string(kv.Value)
				}
				out = append(out, broker.Message{Body: r.Value, Key: r.Key, Headers: h})
			})
			return out
		},
	}
}

// apacheTopic creates a topic of its own on the local Apache Kafka (make
// brokers starts it; a missing broker fails the test) and deletes it, its
// derived topics and its group afterwards.
func apacheTopic(t *testing.T) ([]string, string) {
	t.Helper()
	brokers := []string{"127.0.0.1:19092"}
	if v := os.Getenv("HANDOFF_KAFKA_BROKERS"); v != "" {
		brokers = strings.Split(v, ",")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	var b [4]byte
	_, _ = rand.Read(b[:])
	topic := "contract-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		cl.Close()
		t.Fatalf("Apache Kafka at %v is required (scripts/kafka-local start): %v", brokers, err)
	}
	t.Cleanup(func() {
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic, DeadLetterTopic(topic, topic+"-g"), RetryTopic(topic, topic+"-g", contractTier))
		_, _ = adm.DeleteGroups(ctx, topic+"-g")
	})
	return brokers, topic
}
