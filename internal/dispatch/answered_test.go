package dispatch

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
)

// Walks whose calls go out in batches: no goroutine waits on the call, the
// answer goes on with the walk (handoff.Answered).

// batchApp answers each event of a batch by its id's prefix ("ok", "retry",
// "bad"); while hold is open it answers nothing until hold closes or the
// request is cancelled.
type batchApp struct {
	hold    chan struct{}
	batches atomic.Int32
	events  atomic.Int32 // in the batches sent
	mu      sync.Mutex
	calls   map[string]int
}

func (a *batchApp) SendBatch(ctx context.Context, reqs []*handler.Request) ([]handler.Result, handler.Result, bool) {
	a.batches.Add(1)
	a.events.Add(int32(len(reqs)))
	if a.hold != nil {
		select {
		case <-a.hold:
		case <-ctx.Done():
			return nil, handler.Result{Outcome: budget.Unknown, Detail: "cancelled"}, false
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	each := make([]handler.Result, len(reqs))
	for i, r := range reqs {
		a.calls[r.EventID]++
		switch {
		case strings.HasPrefix(r.EventID, "retry"):
			each[i] = handler.Result{Outcome: budget.Retry, Detail: "scripted"}
		case strings.HasPrefix(r.EventID, "bad"):
			each[i] = handler.Result{Outcome: budget.Permanent, Detail: "scripted"}
		default:
			each[i] = handler.Result{Outcome: budget.Success}
		}
	}
	return each, handler.Result{}, false
}

func (a *batchApp) Probe(context.Context) error { return nil }

func deliveries(ds []*fakeDelivery) []broker.Delivery {
	out := make([]broker.Delivery, len(ds))
	for i, d := range ds {
		out[i] = d
	}
	return out
}

// ackChecked runs check when acked, before the ack is recorded.
type ackChecked struct {
	*fakeDelivery
	check func()
}

func (d *ackChecked) Ack() error {
	d.check()
	return d.fakeDelivery.Ack()
}

func TestBatchedWalksGoOnWithTheirAnswers(t *testing.T) {
	r := newRig(t)
	app := &batchApp{calls: map[string]int{}}
	bt := handler.NewBatcher(app, handler.BatchOptions{MaxMessages: 8, MaxWait: time.Millisecond})
	defer bt.Close()
	ids := []string{"ok-1", "retry-1", "ok-2", "bad-1", "ok-3", "ok-4", "retry-2", "ok-5", "ok-6", "ok-7"}
	// At its ack every success's outcome is already in the journal: the
	// commit, not the answer, lets the ack go.
	var early atomic.Int32
	var ds []broker.Delivery
	for _, id := range ids {
		d := &ackChecked{fakeDelivery: r.delivery(id)}
		d.check = func() {
			st, err := r.journal.State(journal.Key{Source: "fake", EventID: id})
			if err != nil || st.HopOutcome == 0 {
				early.Add(1)
			}
		}
		ds = append(ds, d)
	}
	e := r.engineWith(bt, nil, ds...)
	if e.async == nil {
		t.Fatal("the engine does not hand batched calls over; this test needs it to")
	}
	run(t, e, func() bool { return len(r.snapshot()) == len(ids)+3 })

	if n := early.Load(); n != 0 {
		t.Errorf("%d deliveries were acked before their outcome was in the journal", n)
	}
	got := r.snapshot()
	acks, transfers, dead := 0, 0, 0
	for _, ev := range got {
		switch ev.kind {
		case "ack":
			acks++
		case "transfer":
			transfers++
			if ev.dest.DeadLetter {
				dead++
			}
		default:
			t.Errorf("unexpected %s", ev.kind)
		}
	}
	if acks != len(ids) || transfers != 3 || dead != 1 {
		t.Fatalf("events = %v, want %d acks and 3 transfers (two retries, one dead letter)", kinds(got), len(ids))
	}
	for _, id := range ids {
		st, err := r.journal.State(journal.Key{Source: "fake", EventID: id})
		if err != nil || st.HopAttempt != 1 || st.HopOutcome == 0 {
			t.Errorf("%s: journal state %+v (%v), want attempt 1 with its outcome", id, st, err)
		}
		if app.calls[id] != 1 {
			t.Errorf("%s: called %d times, want once", id, app.calls[id])
		}
	}
}

func TestShutdownWithABatchInFlightHandsItBack(t *testing.T) {
	r := newRig(t)
	app := &batchApp{hold: make(chan struct{}), calls: map[string]int{}}
	bt := handler.NewBatcher(app, handler.BatchOptions{MaxMessages: 4, MaxWait: time.Millisecond})
	defer bt.Close()
	var ds []*fakeDelivery
	for _, id := range []string{"ok-1", "ok-2", "ok-3", "ok-4", "ok-5", "ok-6"} {
		ds = append(ds, r.delivery(id))
	}
	// No call times out on its own: only the stop ends them.
	e := r.engineWith(bt, func(o *Options) { o.Timeout = time.Hour }, deliveries(ds)...)
	start := time.Now()
	// The app never answers: every delivery's batch is in flight when
	// the engine stops, and stays so past the drain timeout.
	run(t, e, func() bool { return app.events.Load() == int32(len(ds)) })
	if n := app.events.Load(); n != int32(len(ds)) {
		t.Fatalf("%d events sent, want %d", n, len(ds))
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Run took %v to stop with batches in flight", took)
	}
	got := kinds(r.snapshot())
	if len(got) != len(ds) {
		t.Fatalf("events = %v, want every delivery handed back", got)
	}
	for _, k := range got {
		if k != "release" {
			t.Fatalf("events = %v, want only releases: no answer came", got)
		}
	}
	if n := e.Status().Routes[0].InFlight; n != 0 {
		t.Errorf("%d walks still open after Run returned", n)
	}
}
