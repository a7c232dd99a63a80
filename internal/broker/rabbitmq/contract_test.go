package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

// The broker contract, on the local RabbitMQ.
func TestContract(t *testing.T) {
	brokertest.Run(t, rabbitFixture, brokertest.Capabilities{ReleaseRedeliversAtOnce: true, FlagsRedelivery: true})
}

const contractTier = 500 * time.Millisecond

// channel opens a connection and channel for the test's own use; a missing
// broker fails the test (make brokers starts it), and -short skips it.
func channel(t *testing.T) *amqp.Channel {
	t.Helper()
	brokertest.SkipShort(t, "RabbitMQ")
	conn, err := amqp.Dial(brokertest.RabbitURL())
	if err != nil {
		t.Fatalf("RabbitMQ at %s is required (scripts/rabbitmq-local start): %v", brokertest.RabbitURL(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// both consumes the source queue and the retry queue as one intake.
type both []*Source

func (b both) Consume(ctx context.Context, deliver func(broker.Delivery)) error {
	var wg sync.WaitGroup
	for _, s := range b {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.Consume(ctx, deliver)
		}()
	}
	wg.Wait()
	return nil
}

// sourceQueue declares a quorum queue with a unique name on ch, deleted with
// its derived queues when the test ends.
func sourceQueue(t *testing.T, ch *amqp.Channel, prefix string, tiers ...time.Duration) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	q := prefix + "." + hex.EncodeToString(b[:])
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cl := channel(t)
		for _, name := range []string{q, RetryQueue(q), DeadLetterQueue(q), LedgerQueue(q), migratingQueue(q)} {
			_, _ = cl.QueueDelete(name, false, false, false)
		}
		for _, tier := range tiers {
			_, _ = cl.QueueDelete(TierQueue(q, tier), false, false, false)
		}
	})
	return q
}

func rabbitFixture(t *testing.T) brokertest.Fixture {
	ch := channel(t)
	q := sourceQueue(t, ch, "contract", contractTier)
	return brokertest.Fixture{
		Tier: contractTier,
		Open: func(t *testing.T) (brokertest.Consumer, brokertest.Transferer, func()) {
			c := NewClient(Options{Name: "contract", URL: brokertest.RabbitURL(), Queue: q, Prefetch: 16,
				Tiers: []time.Duration{contractTier}, Declare: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = c.Run(ctx) }()
			testkit.Eventually(t, 15*time.Second, "the client connected", c.Connected)
			return both{c.Source(), c.RetrySource()}, c, func() { cancel(); <-done }
		},
		Publish: func(t *testing.T, id string, body []byte, headers map[string]string) {
			table := amqp.Table{}
			for k, v := range headers {
				table[k] = v
			}
			if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
				MessageId: id, Body: body, Headers: table, DeliveryMode: amqp.Persistent,
			}); err != nil {
				t.Fatal(err)
			}
		},
		DeadLetters: func(t *testing.T) []broker.Message {
			var out []broker.Message
			for _, d := range readStream(t, DeadLetterQueue(q)) {
				out = append(out, broker.Message{Body: d.Body, MessageID: d.MessageId, Headers: stringHeaders(d.Headers)})
			}
			return out
		},
	}
}

// readStream is every message of a stream, read from its first to its end on
// a connection of the test's own.
func readStream(t *testing.T, stream string) []amqp.Delivery {
	t.Helper()
	brokertest.SkipShort(t, "RabbitMQ")
	conn, err := amqp.Dial(brokertest.RabbitURL())
	if err != nil {
		t.Fatalf("RabbitMQ at %s is required (scripts/rabbitmq-local start): %v", brokertest.RabbitURL(), err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []amqp.Delivery
	if err := ReadStream(ctx, conn, stream, "first", func(d *amqp.Delivery) bool {
		out = append(out, *d)
		return true
	}); err != nil {
		t.Fatalf("read %s: %v", stream, err)
	}
	return out
}
