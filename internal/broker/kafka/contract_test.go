package kafka

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
)

// The broker contract, on kfake and on the local Apache Kafka.
func TestContract(t *testing.T) {
	caps := brokertest.Capabilities{FindsRetryCopies: true}
	for _, txn := range []string{"", "contract-txn"} {
		name := ""
		if txn != "" {
			name = "/transactional"
		}
		t.Run("kfake"+name, func(t *testing.T) {
			brokertest.Run(t, func(t *testing.T) brokertest.Fixture {
				return kafkaFixture(t, cluster(t, "contract"), "contract", txn)
			}, caps)
		})
		t.Run("apache"+name, func(t *testing.T) {
			brokertest.Run(t, func(t *testing.T) brokertest.Fixture {
				brokers, topic := brokertest.KafkaTopic(t, "contract", 1)
				id := txn
				if id != "" {
					id += "-" + topic // unique on the shared broker
				}
				return kafkaFixture(t, brokers, topic, id)
			}, caps)
		})
	}
}

// The broker contract on a share group: the topic through the share group,
// its retry topics through the client's poll loop. A record released comes
// back at once, to the same member if it polls first, flagged by its
// delivery count, as one whose member stopped without settling it does.
func TestContractShareGroup(t *testing.T) {
	caps := brokertest.Capabilities{FindsRetryCopies: true, ReleaseRedeliversAtOnce: true, FlagsRedelivery: true}
	t.Run("kfake", func(t *testing.T) {
		brokertest.Run(t, func(t *testing.T) brokertest.Fixture {
			return shareFixture(t, cluster(t, "contract"), "contract")
		}, caps)
	})
	t.Run("apache", func(t *testing.T) {
		brokertest.Run(t, func(t *testing.T) brokertest.Fixture {
			brokers, topic := brokertest.KafkaTopic(t, "contract", 1)
			return shareFixture(t, brokers, topic)
		}, caps)
	})
}

// shareFixture is kafkaFixture on a share group.
func shareFixture(t *testing.T, brokers []string, topic string) brokertest.Fixture {
	f := kafkaFixture(t, brokers, topic, "")
	f.Open = func(t *testing.T) (brokertest.Consumer, brokertest.Transferer, func()) {
		c, err := New(Options{Name: "contract", Brokers: brokers, Topic: topic, Group: brokertest.KafkaGroup(topic), Share: true,
			Tiers: []time.Duration{contractTier}, Declare: true, RevokeTimeout: 100 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Declare(context.Background()); err != nil {
			t.Fatal(err)
		}
		return bothLoops{c.ShareSource(), c}, c, func() { _ = c.Close() }
	}
	return f
}

// bothLoops runs a share group's two loops as one source: the share
// group's records and the retry topics' copies.
type bothLoops [2]brokertest.Consumer

func (b bothLoops) Consume(ctx context.Context, deliver func(broker.Delivery)) error {
	var mu sync.Mutex
	one := func(d broker.Delivery) { mu.Lock(); defer mu.Unlock(); deliver(d) }
	errs := make(chan error, 2)
	for _, c := range b {
		go func() { errs <- c.Consume(ctx, one) }()
	}
	return errors.Join(<-errs, <-errs)
}

const contractTier = 500 * time.Millisecond

// kafkaFixture opens clients of topic; with txn they are transactional.
func kafkaFixture(t *testing.T, brokers []string, topic, txn string) brokertest.Fixture {
	return brokertest.Fixture{
		Tier: contractTier,
		Open: func(t *testing.T) (brokertest.Consumer, brokertest.Transferer, func()) {
			c, err := New(Options{Name: "contract", Brokers: brokers, Topic: topic, Group: brokertest.KafkaGroup(topic),
				Tiers: []time.Duration{contractTier}, Declare: true, TransactionalID: txn,
				// A consumer closed with a delivery unsettled is one that died:
				// no wait for it to settle.
				RevokeTimeout: 100 * time.Millisecond,
				Logger:        slog.New(slog.NewTextHandler(io.Discard, nil))})
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
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(DeadLetterTopic(topic, brokertest.KafkaGroup(topic))),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond),
				kgo.FetchIsolationLevel(kgo.ReadCommitted()))
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
