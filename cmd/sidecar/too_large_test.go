package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// pattern is n bytes that compression and a truncation would both show.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// A message over handler.max_message_bytes never reaches the app: it is
// dead-lettered whole, reason too-large, its size in handoff-error, and
// the source settles. One at the bound is handed over, and one the app
// fails is retried through the retry tier whole.
func TestTooLargeRabbitMQ(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, func(w http.ResponseWriter, c call, prior []call) {
		if c.Header.Get("Ce-Id") == "flaky" && len(prior) == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	cfg := testConfig(a.url(), q, tier)
	cfg.Handler.MaxMessageBytes = 1 << 20
	startSidecar(t, cfg)

	big, fits, flaky := pattern(3<<20, 1), pattern(1<<20, 2), pattern(1<<20, 3)
	publish(t, conn, q,
		publishing{MessageId: "big", ContentType: "application/octet-stream", Body: big},
		publishing{MessageId: "fits", ContentType: "application/octet-stream", Body: fits},
		publishing{MessageId: "flaky", ContentType: "application/octet-stream", Body: flaky})
	dlq := rabbitmq.DeadLetterQueue(q)
	testkit.Eventually(t, 30*time.Second, "the dead letter and both handled", func() bool {
		return len(readStream(t, conn, dlq)) == 1 && len(a.callsFor("fits")) == 1 && len(a.callsFor("flaky")) == 2
	})
	testkit.Eventually(t, 10*time.Second, "the source settled", func() bool { return depth(t, conn, q) == 0 })
	if n := len(a.callsFor("big")); n != 0 {
		t.Errorf("the app was handed the too-large message %d times", n)
	}
	d := readStream(t, conn, dlq)[0]
	if !bytes.Equal(d.Body, big) {
		t.Errorf("the dead letter's body is %d bytes, not the message's %d, byte for byte", len(d.Body), len(big))
	}
	if r, _ := d.Headers[broker.HeaderDeadReason].(string); r != "too-large" {
		t.Errorf("%s = %q, want too-large", broker.HeaderDeadReason, r)
	}
	if e, _ := d.Headers[broker.HeaderError].(string); !strings.Contains(e, strconv.Itoa(len(big))+" bytes") {
		t.Errorf("%s = %q, want the size", broker.HeaderError, e)
	}
	for _, id := range []string{"fits", "flaky"} {
		for _, c := range a.callsFor(id) {
			if len(c.Body) != 1<<20 {
				t.Errorf("%s reached the app with %d bytes, want %d", id, len(c.Body), 1<<20)
			}
		}
	}
}

// The same on Apache Kafka, whose defaults stand in the way twice: the
// client's batches hold about 1 MB, and a topic takes 1 MiB records. The
// source topic here takes 4 MiB; the derived topics the sidecar creates
// take what their copies need, a retry copy of a 1 MiB body goes through,
// and a 3 MiB dead letter goes through a producer of its own.
func TestTooLargeKafka(t *testing.T) {
	t.Parallel()
	brokers, topic := brokertest.KafkaTopic(t, "too-large", 1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerBatchMaxBytes(5<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(cl)
	four := strconv.Itoa(4 << 20)
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &four}}, topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		derived := []string{kafka.DeadLetterTopic(topic, kafkaGroup(topic)), kafka.RetryTopic(topic, kafkaGroup(topic), tier),
			kafka.LedgerTopic(topic, kafkaGroup(topic))}
		_, _ = adm.DeleteTopics(ctx, derived...)
	})

	a := newApp(t, func(w http.ResponseWriter, c call, prior []call) {
		if c.Header.Get("Ce-Id") == "flaky" && len(prior) == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	cfg := kafkaConfig(a.url(), brokers, topic, tier)
	cfg.Handler.MaxMessageBytes = config.ByteSize(1 << 20)
	startSidecar(t, cfg)

	big, fits, flaky := pattern(3<<20, 1), pattern(1<<20, 2), pattern(1<<20, 3)
	rec := func(id string, body []byte) *kgo.Record {
		return &kgo.Record{Topic: topic, Value: body, Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}}
	}
	if err := cl.ProduceSync(ctx, rec("big", big), rec("fits", fits), rec("flaky", flaky)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	dlq := kafka.DeadLetterTopic(topic, kafkaGroup(topic))
	testkit.Eventually(t, 60*time.Second, "the dead letter and both handled", func() bool {
		return len(a.callsFor("fits")) == 1 && len(a.callsFor("flaky")) == 2 && len(readTopic(t, brokers, dlq)) == 1
	})
	if n := len(a.callsFor("big")); n != 0 {
		t.Errorf("the app was handed the too-large record %d times", n)
	}
	d := readTopic(t, brokers, dlq)[0]
	if !bytes.Equal(d.Value, big) || header(d, broker.HeaderDeadReason) != "too-large" ||
		!strings.Contains(header(d, broker.HeaderError), fmt.Sprintf("%d bytes", len(big))) {
		t.Errorf("dead letter: %d bytes, reason %q, error %q; want the record whole, too-large, its size",
			len(d.Value), header(d, broker.HeaderDeadReason), header(d, broker.HeaderError))
	}
	for _, c := range a.callsFor("flaky") {
		if len(c.Body) != 1<<20 {
			t.Errorf("flaky reached the app with %d bytes, want %d", len(c.Body), 1<<20)
		}
	}
}
