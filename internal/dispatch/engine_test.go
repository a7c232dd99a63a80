package dispatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/testkit"
)

// The engine's settle rules, against fakes: no broker, no app.

type event struct {
	kind  string // "transfer", "ack", "release"
	dest  broker.Destination
	trail broker.Headers // a transfer's
}

type fakeDelivery struct {
	msg  broker.Message
	lost chan struct{}
	mu   *sync.Mutex
	log  *[]event
}

func (d *fakeDelivery) Message() *broker.Message { return &d.msg }
func (d *fakeDelivery) Ack() error               { d.record(event{kind: "ack"}); return nil }
func (d *fakeDelivery) Release() error           { d.record(event{kind: "release"}); return nil }
func (d *fakeDelivery) Lost() <-chan struct{}    { return d.lost }
func (d *fakeDelivery) record(e event) {
	d.mu.Lock()
	*d.log = append(*d.log, e)
	d.mu.Unlock()
}

// fakeSource hands out its deliveries, then waits for ctx.
type fakeSource struct {
	ds []broker.Delivery
	// at is the index of the delivery being handed over (deliver not yet
	// returned), then len(ds).
	at atomic.Int32
}

func (s *fakeSource) Consume(ctx context.Context, deliver func(broker.Delivery)) error {
	for i, d := range s.ds {
		s.at.Store(int32(i))
		deliver(d)
	}
	s.at.Store(int32(len(s.ds)))
	<-ctx.Done()
	return nil
}

type fakeTransfer struct {
	fails atomic.Int32 // transfers to fail before succeeding; < 0 fails forever
	tries atomic.Int32 // transfers asked for, failed or not
	mu    *sync.Mutex
	log   *[]event
}

func (f *fakeTransfer) Transfer(_ context.Context, dest broker.Destination, _ *broker.Message, trail broker.Headers) error {
	f.tries.Add(1)
	if n := f.fails.Load(); n != 0 {
		if n > 0 {
			f.fails.Add(-1)
		}
		return errors.New("no route")
	}
	f.mu.Lock()
	*f.log = append(*f.log, event{kind: "transfer", dest: dest, trail: trail})
	f.mu.Unlock()
	return nil
}

type fakeApp struct {
	mu       sync.Mutex
	results  []budget.Outcome // one per call; the last repeats
	attempts []int
	inFlight atomic.Int32
	peak     atomic.Int32
	delay    time.Duration
	probeOK  atomic.Bool
}

func (a *fakeApp) Deliver(ctx context.Context, r *handler.Request) handler.Result {
	n := a.inFlight.Add(1)
	defer a.inFlight.Add(-1)
	for {
		p := a.peak.Load()
		if n <= p || a.peak.CompareAndSwap(p, n) {
			break
		}
	}
	if a.delay > 0 {
		select {
		case <-time.After(a.delay):
		case <-ctx.Done():
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	i := min(len(a.attempts), len(a.results)-1)
	a.attempts = append(a.attempts, r.Attempt)
	return handler.Result{Outcome: a.results[i], Detail: "scripted"}
}

func (a *fakeApp) Probe(context.Context) error {
	if a.probeOK.Load() {
		return nil
	}
	return errors.New("refused")
}

type rig struct {
	mu      sync.Mutex
	events  []event
	app     *fakeApp
	tr      *fakeTransfer
	journal *journal.Journal
}

func newRig(t *testing.T, results ...budget.Outcome) *rig {
	r := &rig{app: &fakeApp{results: results}}
	r.tr = &fakeTransfer{mu: &r.mu, log: &r.events}
	j, _, err := journal.Open(filepath.Join(t.TempDir(), "journal.db"), journal.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	r.journal = j
	return r
}

func (r *rig) delivery(id string) *fakeDelivery {
	return &fakeDelivery{msg: broker.Message{MessageID: id, Origin: "fake:q"}, lost: make(chan struct{}), mu: &r.mu, log: &r.events}
}

func (r *rig) engine(concurrency int, ds ...broker.Delivery) *Engine {
	return New(Options{
		Routes:  []Route{{Name: "fake", Sources: []Source{&fakeSource{ds: ds}}, Transfer: r.tr}},
		Handler: r.app,
		Policy: &budget.Policy{
			MaxAttempts: 3, Base: time.Millisecond, Cap: time.Millisecond,
			Tiers: []time.Duration{time.Second}, Deadline: time.Hour, DeferMaxAge: time.Hour,
			MinAttempt: time.Millisecond, Jitter: func() float64 { return 0 },
		},
		Journal:        r.journal,
		Timeout:        time.Second,
		MaxConcurrency: concurrency,
		DrainTimeout:   200 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
}

func (r *rig) snapshot() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.events...)
}

// run runs e until cond holds (or 30s pass: the test's own checks then
// fail), then stops it.
func run(t *testing.T, e *Engine, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func kinds(es []event) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.kind)
	}
	return out
}

func TestAckOnlyAfterTheCopyIsConfirmed(t *testing.T) {
	r := newRig(t, budget.Permanent)
	r.tr.fails.Store(3)
	d := r.delivery("a")
	run(t, r.engine(4, d), func() bool { return len(r.snapshot()) >= 2 })
	got := r.snapshot()
	if len(got) != 2 || got[0].kind != "transfer" || !got[0].dest.DeadLetter || got[1].kind != "ack" {
		t.Fatalf("events = %v, want a confirmed DLQ transfer, then one ack", kinds(got))
	}
}

func TestFailedTransferNeverAcks(t *testing.T) {
	r := newRig(t, budget.Retry)
	r.tr.fails.Store(-1)
	d := r.delivery("a")
	// Three failed transfers: the engine has tried, backed off and tried
	// again, and acked nothing meanwhile.
	run(t, r.engine(4, d), func() bool { return r.tr.tries.Load() >= 3 })
	got := kinds(r.snapshot())
	if len(got) != 1 || got[0] != "release" {
		t.Fatalf("events = %v, want only a release at shutdown", got)
	}
}

func TestLostDeliveryIsLeftToTheBroker(t *testing.T) {
	r := newRig(t, budget.Retry)
	r.tr.fails.Store(-1)
	d := r.delivery("a")
	e := r.engine(4, d)
	// The delivery is lost while its copy keeps failing to transfer; the
	// walk then ends (the route has nothing open) with nothing settled.
	run(t, e, func() bool {
		if r.tr.tries.Load() >= 1 && !isClosed(d.lost) {
			close(d.lost)
		}
		return isClosed(d.lost) && e.Status().Routes[0].InFlight == 0
	})
	if got := r.snapshot(); len(got) != 0 {
		t.Fatalf("events = %v, want none: a lost delivery can be neither acked nor released", kinds(got))
	}
}

func TestUnreachableHoldsWithoutBurningAttempts(t *testing.T) {
	r := newRig(t, budget.Unreachable, budget.Unreachable, budget.Success)
	e := r.engine(4, r.delivery("a"))
	var sawHeld atomic.Bool
	run(t, e, func() bool {
		// The app comes back once the engine is seen holding for it.
		if e.Ready() != nil {
			sawHeld.Store(true)
			r.app.probeOK.Store(true)
		}
		return len(r.snapshot()) == 1
	})
	if got := kinds(r.snapshot()); len(got) != 1 || got[0] != "ack" {
		t.Fatalf("events = %v, want one ack", got)
	}
	r.app.mu.Lock()
	defer r.app.mu.Unlock()
	for i, a := range r.app.attempts {
		if a != 1 {
			t.Errorf("call %d carried attempt %d, want 1: holding must not burn attempts", i+1, a)
		}
	}
	if !sawHeld.Load() {
		t.Error("Ready never reported the app unreachable while holding")
	}
}

func TestConcurrencyIsBounded(t *testing.T) {
	r := newRig(t, budget.Success)
	r.app.delay = 20 * time.Millisecond
	var ds []broker.Delivery
	for i := range 40 {
		ds = append(ds, r.delivery(fmt.Sprintf("x-%d", i)))
	}
	run(t, r.engine(3, ds...), func() bool { return len(r.snapshot()) == 40 })
	if got := len(r.snapshot()); got != 40 {
		t.Fatalf("%d settled, want 40", got)
	}
	if p := r.app.peak.Load(); p > 3 || p < 2 {
		t.Errorf("peak in-flight calls %d, want up to max_concurrency 3 (and parallel)", p)
	}
}

func TestEventIDOrder(t *testing.T) {
	tests := []struct {
		name   string
		msg    broker.Message
		want   string
		hashed bool
	}{
		{"cloudevents id wins", broker.Message{Headers: broker.Headers{"cloudEvents:id": "ce-1"}, MessageID: "m-1"}, "ce-1", false},
		{"kafka binding spelling", broker.Message{Headers: broker.Headers{"ce_id": "ce-2"}}, "ce-2", false},
		{"message id next", broker.Message{MessageID: "m-1", Position: "kafka:t/0/1"}, "m-1", false},
		{"log position next", broker.Message{Position: "kafka:t/0/1"}, "kafka:t/0/1", false},
		{"content hash last", broker.Message{Body: []byte("b")}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, hashed := eventID(&tt.msg)
			if hashed != tt.hashed || (!tt.hashed && id != tt.want) {
				t.Errorf("eventID = %q, %v; want %q, %v", id, hashed, tt.want, tt.hashed)
			}
		})
	}
	a, _ := eventID(&broker.Message{Body: []byte("b"), Headers: broker.Headers{"k": "1", "handoff-attempt": "3"}})
	b, _ := eventID(&broker.Message{Body: []byte("b"), Headers: broker.Headers{"k": "1"}})
	c, _ := eventID(&broker.Message{Body: []byte("b"), Headers: broker.Headers{"k": "2"}})
	if a != b || a == c {
		t.Errorf("content hash must ignore handoff-* headers and see the others: %s %s %s", a, b, c)
	}
}

// A message larger than MaxMessageBytes never reaches the app: it is
// dead-lettered whole, reason too-large, with its size, and not parsed
// (this one claims to be a structured event and is not JSON at all). A
// message of the bound itself is handled.
func TestTooLargeIsDeadLetteredUnread(t *testing.T) {
	r := newRig(t, budget.Success)
	big := r.delivery("big")
	big.msg.Body = make([]byte, 2049)
	big.msg.ContentType = "application/cloudevents+json"
	fits := r.delivery("fits")
	fits.msg.Body = make([]byte, 2048)
	e := r.engine(4, big, fits)
	e.o.MaxMessageBytes = 2048
	run(t, e, func() bool { return len(r.snapshot()) >= 3 })
	var dl *event
	acks := 0
	for _, ev := range r.snapshot() {
		switch ev.kind {
		case "transfer":
			dl = &ev
		case "ack":
			acks++
		}
	}
	if dl == nil || !dl.dest.DeadLetter || dl.trail[broker.HeaderDeadReason] != "too-large" ||
		!strings.Contains(dl.trail[broker.HeaderError], "2049 bytes") || !strings.Contains(dl.trail[broker.HeaderError], "max_message_bytes (2048)") {
		t.Fatalf("dead letter %+v, want reason too-large with the size and the bound", dl)
	}
	if acks != 2 {
		t.Errorf("%d acks, want both messages settled", acks)
	}
	r.app.mu.Lock()
	defer r.app.mu.Unlock()
	if len(r.app.attempts) != 1 {
		t.Errorf("the app was called %d times, want once (the message that fits)", len(r.app.attempts))
	}
}

// fencedDelivery is a delivery whose hand-out is made durable when durable
// is closed.
type fencedDelivery struct {
	*fakeDelivery
	durable chan struct{}
}

func (d *fencedDelivery) Durable() <-chan struct{} { return d.durable }

// No call is made for a delivery before its hand-out is durable (a Kafka
// partition's handed-out mark); once it is, the call goes ahead.
func TestNoCallBeforeTheHandOutIsDurable(t *testing.T) {
	r := newRig(t, budget.Success)
	d := &fencedDelivery{fakeDelivery: r.delivery("a"), durable: make(chan struct{})}
	e := r.engine(4, d)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// Taken, and holding a slot for its call: the walk is at the fence.
	// A call that did not wait would come within the window after.
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return e.Status().InFlight > 0 })
	time.Sleep(100 * time.Millisecond)
	r.app.mu.Lock()
	calls := len(r.app.attempts)
	r.app.mu.Unlock()
	if calls != 0 || r.app.inFlight.Load() != 0 {
		t.Fatalf("%d calls before the hand-out was durable", calls+int(r.app.inFlight.Load()))
	}
	close(d.durable)
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return len(r.snapshot()) > 0 })
	if got := kinds(r.snapshot()); len(got) != 1 || got[0] != "ack" {
		t.Fatalf("events = %v, want the call made and acked once durable", got)
	}
}
