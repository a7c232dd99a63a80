package rabbitmq

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
)

// connected runs a client on q until the test ends.
func connected(t *testing.T, q string) *Client {
	t.Helper()
	c := NewClient(Options{Name: "test", URL: brokertest.RabbitURL(), Queue: q, Prefetch: 16, Declare: true,
		DeadLetterRetention: time.Hour, Logger: quietLogger()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	ctx2, cancel2 := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel2()
	if _, err := c.await(ctx2); err != nil {
		t.Fatalf("not connected: %v", err)
	}
	return c
}

func deadLetter(id string, hops int, headers amqp.Table) (*broker.Message, broker.Headers) {
	d := &amqp.Delivery{MessageId: id, Body: []byte("body-" + id), Headers: headers}
	trail := broker.Trail{EventID: id, Attempt: hops, Hops: hops, DeadReason: "permanent"}
	return &broker.Message{Body: d.Body, MessageID: id, Native: d}, trail.Headers()
}

// Dead-letter copies land in a stream and read back from its first message;
// header values a stream cannot hold (a table, an array, a decimal, which
// would close the connection) are kept as text.
func TestDeadLetterCopiesLandInAStream(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "dlq-stream")
	c := connected(t, q)
	if kind, typ, err := inspectQueue(c.current().conn, DeadLetterQueue(q)); kind != queueStream {
		t.Fatalf("%s is %s (%v), want a stream", DeadLetterQueue(q), typ, err)
	}
	ctx := context.Background()
	for i := range 3 {
		msg, trail := deadLetter("e-"+strconv.Itoa(i), 1, amqp.Table{"x-tenant": "acme",
			"x-price": amqp.Decimal{Scale: 2, Value: 1999}, "x-tags": []any{"a", int32(1)}, "x-meta": amqp.Table{"k": "v"}})
		if err := c.Transfer(ctx, broker.Destination{DeadLetter: true}, msg, trail); err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
	}
	got := readStream(t, DeadLetterQueue(q))
	if len(got) != 3 {
		t.Fatalf("the stream holds %d copies, want 3", len(got))
	}
	for i, d := range got {
		want := map[string]any{broker.HeaderEventID: "e-" + strconv.Itoa(i), "x-tenant": "acme",
			"x-price": "19.99", "x-tags": `["a",1]`, "x-meta": `{"k":"v"}`}
		for k, v := range want {
			if d.Headers[k] != v {
				t.Errorf("copy %d: %s = %#v, want %#v", i, k, d.Headers[k], v)
			}
		}
		if string(d.Body) != "body-e-"+strconv.Itoa(i) {
			t.Errorf("copy %d: body %q", i, d.Body)
		}
	}
	if !c.Connected() {
		t.Error("the connection was lost publishing the copies")
	}
}

// After a crash between publishing a dead-letter copy and recording its
// confirm, the look-up finds the copy, behind other dead letters and while
// more arrive; a copy that was never published is not found.
func TestFindCopyReadsTheStreamBack(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "find")
	c := connected(t, q)
	ctx := context.Background()
	dead := broker.Destination{DeadLetter: true}
	for i := range 50 {
		msg, trail := deadLetter(fmt.Sprintf("before-%d", i), 1, nil)
		if err := c.Transfer(ctx, dead, msg, trail); err != nil {
			t.Fatal(err)
		}
	}
	// The copy the crashed process published: it reached the stream, its
	// confirm was never recorded.
	recorded := time.Now()
	msg, trail := deadLetter("crashed", 2, nil)
	if err := c.Transfer(ctx, dead, msg, trail); err != nil {
		t.Fatal(err)
	}
	_, never := deadLetter("never-published", 2, nil)
	_, otherHop := deadLetter("crashed", 3, nil)

	// Other sidecars go on dead-lettering during the look-up.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			msg, trail := deadLetter(fmt.Sprintf("after-%d", i), 1, nil)
			if err := c.Transfer(ctx, dead, msg, trail); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	tests := []struct {
		name  string
		trail broker.Headers
		since time.Time
		want  bool
	}{
		{"published before the crash", trail, recorded, true},
		{"read from the first", trail, time.Time{}, true},
		{"never published", never, recorded, false},
		{"another hop of the same event", otherHop, recorded, false},
		// The read starts at the time asked for, less a minute's slack: a
		// copy older than that is not read at all.
		{"published before the time read from", trail, recorded.Add(5 * time.Minute), false},
	}
	for _, tt := range tests {
		found, err := c.FindCopy(ctx, dead, tt.trail, tt.since)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if found != tt.want {
			t.Errorf("%s: found %v, want %v", tt.name, found, tt.want)
		}
	}
	if found, err := c.FindCopy(ctx, broker.Destination{Tier: time.Second}, trail, recorded); found || err != nil {
		t.Errorf("a retry copy is never looked for: %v, %v", found, err)
	}
}

// A stream read ends at the end it had when it began, even while others keep
// appending, and sees everything that was there.
func TestReadStreamEndsWhileOthersAppend(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "read")
	stream := DeadLetterQueue(q)
	if _, err := ch.QueueDeclare(stream, true, false, false, false, streamArgs(time.Hour)); err != nil {
		t.Fatal(err)
	}
	conn := dial(t)
	pub, err := newPublisher(conn, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const before = 2000
	for i := range before {
		if _, err := pub.start(ctx, stream, amqp.Publishing{MessageId: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.publish(ctx, stream, amqp.Publishing{MessageId: "last-before"}); err != nil {
		t.Fatal(err)
	}
	// Appends every few milliseconds, so the read never sees a quiet
	// moment: it must end by the offset of the first message appended after
	// it began.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = pub.publish(ctx, stream, amqp.Publishing{MessageId: "after"})
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	seen := map[string]bool{}
	if err := ReadStream(rctx, conn, stream, "first", func(d *amqp.Delivery) bool {
		seen[d.MessageId] = true
		return true
	}); err != nil {
		t.Fatalf("ReadStream = %v; it must end by itself", err)
	}
	for i := range before {
		if !seen[strconv.Itoa(i)] {
			t.Fatalf("message %d, there before the read began, was not read", i)
		}
	}
	if !seen["last-before"] {
		t.Error("the last message before the read began was not read")
	}
}

// Reads end their consumers: RabbitMQ 3.10 keeps counting a stream consumer
// whose channel closed without cancelling it, one more per read, for as long
// as the connection lives — a sidecar reading its logs every second would
// pile up thousands.
func TestReadStreamLeavesNoConsumer(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "readers")
	stream := DeadLetterQueue(q)
	if _, err := ch.QueueDeclare(stream, true, false, false, false, streamArgs(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := ch.Publish("", stream, false, false, amqp.Publishing{MessageId: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	conn := dial(t)
	ctx := context.Background()
	for range 4 {
		if err := ReadStream(ctx, conn, stream, "first", func(*amqp.Delivery) bool { return true }); err != nil {
			t.Fatal(err)
		}
		if err := ReadStream(ctx, conn, stream, "first", func(*amqp.Delivery) bool { return false }); err != nil {
			t.Fatal(err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	_ = ReadStream(cctx, conn, stream, "first", func(*amqp.Delivery) bool { cancel(); return true })
	// AMQP's queue.declare-ok says 0 for a stream whatever it counts: the
	// broker's own listing says what it keeps.
	out, err := exec.Command("rabbitmqctl", "-q", "list_queues", "name", "consumers").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == stream && f[1] != "0" {
			t.Fatalf("%s consumers left on the stream after 9 reads on a live connection", f[1])
		}
	}
}
