package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
)

var errCrash = errors.New("simulated crash")

// dial opens a connection of the test's own; closing it is how a test
// crashes a migration: what it took and did not ack goes back to the queue.
func dial(t *testing.T) *amqp.Connection {
	t.Helper()
	channel(t) // skips under -short, fails without a broker
	conn, err := amqp.Dial(brokertest.RabbitURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// oldDeadLetters declares q's DLQ as the earlier version did (a quorum queue)
// and puts n dead-letter copies in it as this version writes them: the
// original's body, properties and headers plus the handoff-* trail.
func oldDeadLetters(t *testing.T, ch *amqp.Channel, q string, n int) []amqp.Publishing {
	t.Helper()
	dlq := DeadLetterQueue(q)
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	first := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var out []amqp.Publishing
	for i := range n {
		orig := amqp.Delivery{
			MessageId: fmt.Sprintf("order-%d", i), ContentType: "application/json", CorrelationId: "corr-" + strconv.Itoa(i),
			AppId: "shop", Type: "order.created", Timestamp: first.Add(time.Duration(i) * time.Second),
			Body: []byte(fmt.Sprintf(`{"order":%d,"amount":"invalid"}`, i)),
			Headers: amqp.Table{"x-tenant": "acme", "x-retries-seen": int32(i), "x-vip": i%2 == 0,
				"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		}
		msg := broker.Message{Body: orig.Body, ContentType: orig.ContentType, MessageID: orig.MessageId, Type: orig.Type, Native: &orig}
		trail := broker.Trail{EventID: orig.MessageId, Attempt: 4, Hops: 1, FirstAttemptAt: first, FirstFailureAt: first,
			Deadline: first.Add(time.Hour), ErrorClass: "permanent", Error: "HTTP 422: amount is not a number",
			Origin: "rabbitmq:" + q, DeadReason: "permanent"}
		p := copyOf(&msg, trail.Headers())
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", dlq, true, false, p)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatalf("dead letter %d not confirmed: %v", i, err)
		}
		out = append(out, p)
	}
	return out
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// checkMigrated asserts that q's DLQ is a stream holding want, in order, body,
// properties and headers unchanged, and that nothing of the move is left.
func checkMigrated(t *testing.T, conn *amqp.Connection, q string, want []amqp.Publishing) {
	t.Helper()
	for name, wantKind := range map[string]queueKind{DeadLetterQueue(q): queueStream, migratingQueue(q): queueMissing, migrationLock(q): queueMissing} {
		if kind, typ, err := inspectQueue(conn, name); err != nil || kind != wantKind {
			t.Errorf("%s: kind %v (%s, %v), want %v", name, kind, typ, err, wantKind)
		}
	}
	got := readStream(t, DeadLetterQueue(q))
	if len(got) != len(want) {
		t.Fatalf("the stream holds %d dead letters, want %d", len(got), len(want))
	}
	for i := range want {
		if diff := differ(want[i], &got[i]); diff != "" {
			t.Errorf("dead letter %d: %s", i, diff)
		}
	}
}

// differ says how a message read back from a stream differs from what was
// published; the broker's own x-stream-offset header aside.
func differ(want amqp.Publishing, got *amqp.Delivery) string {
	if string(got.Body) != string(want.Body) {
		return fmt.Sprintf("body %q, want %q", got.Body, want.Body)
	}
	gp := amqp.Publishing{ContentType: got.ContentType, ContentEncoding: got.ContentEncoding, DeliveryMode: got.DeliveryMode,
		Priority: got.Priority, CorrelationId: got.CorrelationId, ReplyTo: got.ReplyTo, MessageId: got.MessageId,
		Timestamp: got.Timestamp.UTC(), Type: got.Type, AppId: got.AppId}
	wp := want
	wp.Headers, wp.Body, wp.Timestamp = nil, nil, want.Timestamp.UTC()
	if !reflect.DeepEqual(gp, wp) {
		return fmt.Sprintf("properties %+v, want %+v", gp, wp)
	}
	h := amqp.Table{}
	for k, v := range got.Headers {
		if k != streamOffsetArg {
			h[k] = v
		}
	}
	if !reflect.DeepEqual(h, want.Headers) {
		return fmt.Sprintf("headers %#v, want %#v", h, want.Headers)
	}
	return ""
}

// A quorum Q.dlq of the earlier version, holding 30 dead letters, is moved
// into a stream Q.dlq when the sidecar connects: the same 30, byte for byte.
func TestMigrateQuorumDeadLetterQueue(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "migrate")
	want := oldDeadLetters(t, ch, q, 30)
	conn := dial(t)
	topo := Topology{Queue: q, Declare: true, Logger: quietLogger()}
	if err := topo.declare(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	checkMigrated(t, conn, q, want)
	// Connecting again changes nothing.
	if err := topo.declare(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	checkMigrated(t, conn, q, want)
}

// A migration stopped at any step — the process crashed, its connection
// closed — is finished by the next connection: nothing lost, nothing twice.
func TestMigrateCrashAtEachStep(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		step migrationStep
		n    int
	}{
		{"first batch confirmed in the holding stream, not acked", stepMoved, 1},
		{"third batch confirmed in the holding stream, two acked", stepMoved, 3},
		{"old queue emptied, not deleted", stepDrained, 0},
		{"old queue deleted, stream not declared", stepDeleted, 0},
		{"second batch copied back", stepCopiedBack, 2},
		{"everything copied back, holding stream not deleted", stepCopiedAll, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ch := channel(t)
			q := sourceQueue(t, ch, "migrate-crash")
			want := oldDeadLetters(t, ch, q, 30)
			crashed := false
			topo := Topology{Queue: q, Declare: true, Logger: quietLogger(), moveBatch: 8,
				fault: func(step migrationStep, n int) error {
					if step == tt.step && n == tt.n && !crashed {
						crashed = true
						return errCrash
					}
					return nil
				}}
			conn := dial(t)
			if err := topo.declare(context.Background(), conn); !errors.Is(err, errCrash) {
				t.Fatalf("declare = %v, want the crash", err)
			}
			_ = conn.Close()
			conn = dial(t)
			if err := topo.declare(context.Background(), conn); err != nil {
				t.Fatalf("declare after the crash: %v", err)
			}
			checkMigrated(t, conn, q, want)
		})
	}
}

// Crashes at every step in turn, each followed by a restart that gets one
// step further: the moves of all the runs add up to one, exactly.
func TestMigrateCrashAtEveryStepInTurn(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "migrate-turns")
	want := oldDeadLetters(t, ch, q, 30)
	crashes := []struct {
		step migrationStep
		n    int
	}{{stepMoved, 2}, {stepMoved, 1}, {stepDrained, 0}, {stepDeleted, 0}, {stepCopiedBack, 1}, {stepCopiedBack, 2}, {stepCopiedAll, 0}}
	for i, c := range crashes {
		topo := Topology{Queue: q, Declare: true, Logger: quietLogger(), moveBatch: 8,
			fault: func(step migrationStep, n int) error {
				if step == c.step && n == c.n {
					return errCrash
				}
				return nil
			}}
		conn := dial(t)
		if err := topo.declare(context.Background(), conn); !errors.Is(err, errCrash) {
			t.Fatalf("run %d (crash at %v/%d): declare = %v, want the crash", i, c.step, c.n, err)
		}
		_ = conn.Close()
	}
	conn := dial(t)
	if err := (Topology{Queue: q, Declare: true, Logger: quietLogger()}).declare(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	checkMigrated(t, conn, q, want)
}

// Two sidecars never move one queue at once: the second finds the lock held.
func TestMigrateOneAtATime(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "migrate-lock")
	want := oldDeadLetters(t, ch, q, 3)
	holder := dial(t)
	hch, err := holder.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hch.QueueDeclare(migrationLock(q), false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	conn := dial(t)
	topo := Topology{Queue: q, Declare: true, Logger: quietLogger()}
	if err := topo.declare(context.Background(), conn); !errors.Is(err, ErrMigrationBusy) {
		t.Fatalf("declare while another holds the lock = %v, want ErrMigrationBusy", err)
	}
	if kind, _, _ := inspectQueue(conn, DeadLetterQueue(q)); kind != queueOther {
		t.Fatalf("the old queue was touched while another held the lock")
	}
	_ = holder.Close() // the holder crashed: the broker drops its lock
	if err := topo.declare(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	checkMigrated(t, conn, q, want)
}

// With declare: false nothing is created or moved; a missing DLQ, or one that
// is not a stream, stops the connection with advice.
func TestDeadLetterStreamWithoutDeclare(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		prepare func(t *testing.T, ch *amqp.Channel, q string)
		want    string // in the error; "" for none
	}{
		{"missing", func(*testing.T, *amqp.Channel, string) {}, "does not exist"},
		{"quorum", func(t *testing.T, ch *amqp.Channel, q string) { oldDeadLetters(t, ch, q, 1) }, "is a quorum queue, not a stream"},
		{"stream", func(t *testing.T, ch *amqp.Channel, q string) {
			for _, name := range []string{DeadLetterQueue(q), LedgerQueue(q)} {
				if _, err := ch.QueueDeclare(name, true, false, false, false, streamArgs(time.Hour)); err != nil {
					t.Fatal(err)
				}
			}
		}, ""},
		{"ledger missing", func(t *testing.T, ch *amqp.Channel, q string) {
			if _, err := ch.QueueDeclare(DeadLetterQueue(q), true, false, false, false, streamArgs(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}, "ledger stream"},
		{"interrupted move", func(t *testing.T, ch *amqp.Channel, q string) {
			for _, name := range []string{DeadLetterQueue(q), migratingQueue(q)} {
				if _, err := ch.QueueDeclare(name, true, false, false, false, streamArgs(time.Hour)); err != nil {
					t.Fatal(err)
				}
			}
		}, "was interrupted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ch := channel(t)
			q := sourceQueue(t, ch, "nodeclare")
			if _, err := ch.QueueDeclare(RetryQueue(q), true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
				t.Fatal(err)
			}
			tt.prepare(t, ch, q)
			err := Topology{Queue: q, Declare: false, Logger: quietLogger()}.declare(context.Background(), dial(t))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("declare = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("declare = %v, want an error saying %q", err, tt.want)
			}
			if kind, _, _ := inspectQueue(dial(t), migratingQueue(q)); kind != queueMissing && tt.name != "interrupted move" {
				t.Error("declare: false created the holding stream")
			}
		})
	}
}

// The client moves an earlier quorum Q.dlq when it connects, and logs how
// many dead letters it moved.
func TestClientMovesTheOldDeadLetterQueueOnConnect(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "migrate-client")
	want := oldDeadLetters(t, ch, q, 30)
	var logs syncBuffer
	c := NewClient(Options{Name: "test", URL: brokertest.RabbitURL(), Queue: q, Prefetch: 16, Declare: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	s, err := c.await(wctx)
	if err != nil {
		t.Fatalf("not connected: %v", err)
	}
	checkMigrated(t, s.conn, q, want)
	if out := logs.String(); !strings.Contains(out, "the dead-letter queue is a stream now") || !strings.Contains(out, "moved=30") {
		t.Errorf("the move is not logged with its count:\n%s", out)
	}
}

// syncBuffer is a log destination safe for the client's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A dead-letter stream declared with other arguments (another retention) is
// used as it is, with a warning; it is never redeclared or moved.
func TestDeadLetterStreamWithOtherRetention(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "otherretention")
	if _, err := ch.QueueDeclare(DeadLetterQueue(q), true, false, false, false,
		amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeStream, amqp.StreamMaxAgeArg: "7D"}); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	conn := dial(t)
	topo := Topology{Queue: q, Declare: true, DeadLetterRetention: 14 * 24 * time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	if err := topo.declare(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "arguments differ") {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
	if kind, _, _ := inspectQueue(conn, migratingQueue(q)); kind != queueMissing {
		t.Error("a stream was moved")
	}
}

func TestMaxAge(t *testing.T) {
	tests := []struct {
		name string
		in   time.Duration
		want string
	}{
		{"default", 0, "14D"},
		{"days", 336 * time.Hour, "14D"},
		{"hours", 36 * time.Hour, "36h"},
		{"minutes", 90 * time.Minute, "90m"},
		{"seconds", 90 * time.Second, "90s"},
		{"a part of a second counts whole", 1500 * time.Millisecond, "2s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := maxAge(tt.in); got != tt.want {
				t.Errorf("maxAge(%v) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}
