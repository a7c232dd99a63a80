package deadletter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
)

// transferer is what the tests dead-letter with: the adapters' Transfer.
type transferer interface {
	Transfer(ctx context.Context, dest broker.Destination, msg *broker.Message, trail broker.Headers) error
}

// catchUpContract dead-letters through a real adapter, builds an index from
// the broker's logs, records transitions through the ledger, and checks
// that a second replica's index shows the same, and that a reopened index
// reads only what is new.
func catchUpContract(t *testing.T, src Source, tr transferer) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	deadLetter := func(i int) {
		t.Helper()
		reason := "permanent"
		if i%2 == 1 {
			reason = "max-attempts"
		}
		trail := broker.Trail{EventID: fmt.Sprint("ev-", i), Attempt: 3, Hops: 3, DeadReason: reason,
			ErrorClass: "permanent", Error: "amount invalid", FirstFailureAt: time.Now().Add(-time.Minute)}
		msg := &broker.Message{Body: []byte(`{"amount":"invalid"}`), ContentType: "application/json"}
		if err := tr.Transfer(ctx, broker.Destination{DeadLetter: true}, msg, trail.Headers()); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		deadLetter(i)
	}
	dir := t.TempDir()
	a := openIndex(t, filepath.Join(dir, "a.deadletters"))
	if c, err := a.CatchUp(ctx, src); err != nil || c.Letters != 5 {
		t.Fatalf("catch-up %+v, %v", c, err)
	}
	p, err := a.List(Filter{Source: src.Name, States: []State{Pending}})
	if err != nil || len(p.Letters) != 5 {
		t.Fatalf("list %+v, %v", p, err)
	}
	// Kafka spreads the copies over partitions: the list's order is theirs.
	byEvent := map[string]Letter{}
	for _, l := range p.Letters {
		byEvent[l.EventID] = l
	}
	if l := byEvent["ev-1"]; l.Reason != "max-attempts" || l.Attempts != 3 || l.Error != "amount invalid" || l.DeadLetteredAt.IsZero() {
		t.Fatalf("letter %+v", l)
	}
	m, err := Message(ctx, src, p.Letters[3].ID)
	if err != nil || string(m.Body) != `{"amount":"invalid"}` || m.Headers[broker.HeaderEventID] != p.Letters[3].EventID {
		t.Fatalf("message of %s: %+v, %v", p.Letters[3].ID, m, err)
	}
	approve, terminate := p.Letters[0].ID, p.Letters[1].ID
	repair := &Repair{Body: []byte(`{"amount":10}`), ContentType: "application/json", Note: "amount=invalid → amount=10"}
	if l, err := a.Apply(ctx, src, Change{ID: approve, Transition: Approve, Who: "alice", Why: "app fixed", Repair: repair}); err != nil || l.State != Approved {
		t.Fatalf("approve: %+v, %v", l, err)
	}
	if l, err := a.Apply(ctx, src, Change{ID: terminate, Transition: Terminate, Who: "bob", Why: "duplicate"}); err != nil || l.State != Terminated {
		t.Fatalf("terminate: %+v, %v", l, err)
	}
	if _, err := a.Apply(ctx, src, Change{ID: terminate, Transition: Approve, Who: "alice"}); err == nil {
		t.Fatal("approved a terminated dead letter")
	}

	// Another replica, from scratch, sees the same.
	b := openIndex(t, filepath.Join(dir, "b.deadletters"))
	if c, err := b.CatchUp(ctx, src); err != nil || c.Letters != 5 || c.Records != 2 {
		t.Fatalf("second replica: %+v, %v", c, err)
	}
	for _, x := range []*Index{a, b} {
		counts, err := x.Counts(src.Name)
		if err != nil || counts.ByState[Pending] != 3 || counts.ByState[Approved] != 1 || counts.ByState[Terminated] != 1 || counts.Open != 4 {
			t.Fatalf("counts %+v, %v", counts, err)
		}
		l, err := x.Get(approve)
		if err != nil || string(l.Approval().Repair.Body) != `{"amount":10}` || l.Approval().Who != "alice" {
			t.Fatalf("approved letter %+v, %v", l, err)
		}
	}

	// A restarted replica reads only what is new.
	path := filepath.Join(dir, "b.deadletters")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	deadLetter(5)
	b = openIndex(t, path)
	if c, err := b.CatchUp(ctx, src); err != nil || c.Letters != 1 || c.Records != 0 {
		t.Fatalf("restarted replica: %+v, %v", c, err)
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestCatchUpRabbitMQ(t *testing.T) {
	brokertest.SkipShort(t, "RabbitMQ")
	conn, err := amqp.Dial(brokertest.RabbitURL())
	if err != nil {
		t.Fatalf("RabbitMQ is required (make brokers): %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	q := "deadletter." + hex.EncodeToString(r[:])
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{q, rabbitmq.RetryQueue(q), rabbitmq.DeadLetterQueue(q), rabbitmq.LedgerQueue(q)} {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	})
	c := rabbitmq.NewClient(rabbitmq.Options{Name: "test", URL: brokertest.RabbitURL(), Queue: q, Prefetch: 16, Declare: true,
		DeadLetterRetention: time.Hour, Logger: quiet()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	src := Source{Name: "orders", DLQ: c.DeadLetterLog(), Ledger: c.LedgerLog()}
	// Waits for the connection, and the topology with it.
	if _, err := src.Ledger.First(ctx); err != nil {
		t.Fatal(err)
	}
	catchUpContract(t, src, c)
}

func kafkaContract(t *testing.T, brokers []string, topic string) {
	c, err := kafka.New(kafka.Options{Name: "test", Brokers: brokers, Topic: topic, Group: brokertest.KafkaGroup(topic),
		Declare: true, DeadLetterRetention: time.Hour, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Declare(context.Background()); err != nil {
		t.Fatal(err)
	}
	led, err := c.LedgerLog()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(led.Close)
	catchUpContract(t, Source{Name: "orders", DLQ: c.DeadLetterLog(), Ledger: led}, c)
}

func TestCatchUpKafka(t *testing.T) {
	brokers, topic := brokertest.KafkaTopic(t, "deadletter", 2)
	kafkaContract(t, brokers, topic)
}

func TestCatchUpKfake(t *testing.T) {
	cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	kafkaContract(t, cl.ListenAddrs(), "orders")
}

// compile-time checks that the adapters are the logs this package needs.
var (
	_ Log       = (*rabbitmq.StreamLog)(nil)
	_ LedgerLog = (*rabbitmq.StreamLog)(nil)
	_ Log       = (*kafka.TopicLog)(nil)
	_ LedgerLog = (*kafka.TopicLog)(nil)
)
