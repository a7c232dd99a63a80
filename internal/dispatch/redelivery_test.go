package dispatch

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
)

func (r *rig) engineMax(maxAttempts int, ds ...broker.Delivery) *Engine {
	return New(Options{
		Routes:  []Route{{Name: "fake", Sources: []Source{&fakeSource{ds: ds}}, Transfer: r.tr}},
		Handler: r.app,
		Policy: &budget.Policy{
			MaxAttempts: maxAttempts, Base: time.Millisecond, Cap: time.Millisecond,
			Tiers: []time.Duration{time.Second}, Deadline: time.Hour, DeferMaxAge: time.Hour,
			MinAttempt: time.Millisecond, Jitter: func() float64 { return 0 },
		},
		Journal: r.journal, Timeout: time.Second, MaxConcurrency: 4,
		DrainTimeout: 100 * time.Millisecond,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
}

func (r *rig) calls() int { r.app.mu.Lock(); defer r.app.mu.Unlock(); return len(r.app.attempts) }

// Hold (app refusing connections), then a shutdown hands the message back:
// its redelivery must not count the refused call as an attempt (it used to be
// resumed as UNKNOWN and, with max_attempts 1, dead-lettered unseen).
func TestHoldAcrossRestartBurnsNoAttempt(t *testing.T) {
	r := newRig(t, budget.Unreachable)
	d1 := r.delivery("evt-1")
	e1 := r.engineMax(1, d1)
	// Shut down once the refused call has put the engine on hold.
	run(t, e1, func() bool { return r.calls() >= 1 && e1.Ready() != nil })
	t.Logf("first run events: %v (app calls %d, all refused)", kinds(r.snapshot()), r.calls())

	r.app = &fakeApp{results: []budget.Outcome{budget.Success}}
	r.app.probeOK.Store(true)
	d2 := r.delivery("evt-1")
	d2.msg.Redelivered = true
	// Until the redelivery is settled (the first run's release is the one
	// event before).
	run(t, r.engineMax(1, d2), func() bool {
		ev := r.snapshot()
		return len(ev) >= 2 && ev[len(ev)-1].kind == "ack"
	})
	got := r.snapshot()
	t.Logf("second run events: %v, app calls %d", kinds(got), r.calls())
	if r.calls() == 0 {
		t.Errorf("the app never received the message; it was %v (dead-letter=%v) with max_attempts=1", kinds(got[1:]), len(got) > 1 && got[1].dest.DeadLetter)
	}
}

// Two publishes with identical content and no id get one (hashed) event id;
// the second is not a redelivery and must reach the app too.
func TestIdenticalMessagesWithoutIDAreBothHandled(t *testing.T) {
	r := newRig(t, budget.Success)
	mk := func() *fakeDelivery {
		d := r.delivery("")
		d.msg.Body = []byte(`{"cmd":"send-reminder","user":5}`)
		return d
	}
	run(t, r.engine(4, mk()), func() bool { return len(r.snapshot()) == 1 })
	run(t, r.engine(4, mk()), func() bool { return len(r.snapshot()) == 2 })
	t.Logf("events %v, app calls %d", kinds(r.snapshot()), r.calls())
	if r.calls() != 2 {
		t.Errorf("second, never-delivered-before message (Redelivered=false) was acked without reaching the app: calls=%d", r.calls())
	}
}

// An operator moves a dead letter back to the source queue (shovel / "move
// messages"): it keeps its message_id, and its handoff-* headers are ignored
// on entry. It is a new publish, not a redelivery: it must reach the app.
func TestDeadLetterMovedBackIsHandledAgain(t *testing.T) {
	r := newRig(t, budget.Permanent, budget.Success)
	run(t, r.engine(4, r.delivery("order-42")), func() bool { return len(r.snapshot()) == 2 })
	moved := r.delivery("order-42")
	moved.msg.Headers = broker.Headers{"handoff-event-id": "order-42", "handoff-attempt": "1", "handoff-hops": "1", "handoff-dead-reason": "permanent"}
	run(t, r.engine(4, moved), func() bool { return len(r.snapshot()) == 3 })
	got := r.snapshot()
	t.Logf("events %v, app calls %d", kinds(got), r.calls())
	if r.calls() != 2 {
		t.Errorf("the re-driven dead letter was acked (%v) without reaching the app or the DLQ: it is gone", kinds(got[2:]))
	}
}

// A malformed copy in the retry queue is journaled under a key of its own: a
// later message with the same event id must not be settled by its records.
func TestMalformedCopyLeavesTheEventsHistoryAlone(t *testing.T) {
	r := newRig(t, budget.Success)
	bad := r.delivery("m-7")
	bad.msg.Copy = true
	bad.msg.Headers = broker.Headers{"handoff-event-id": "m-7", "handoff-attempt": "x"}
	run(t, r.engine(4, bad), func() bool { return len(r.snapshot()) == 2 })
	run(t, r.engine(4, r.delivery("m-7")), func() bool { return len(r.snapshot()) == 3 })
	got := r.snapshot()
	t.Logf("events %v, app calls %d", kinds(got), r.calls())
	if r.calls() != 1 {
		t.Errorf("fresh m-7 acked without an app call after a malformed copy of m-7 was dead-lettered")
	}
}

// stateApp reads the journal during each call.
type stateApp struct {
	*fakeApp
	during func()
}

func (a stateApp) Deliver(ctx context.Context, r *handler.Request) handler.Result {
	a.during()
	return a.fakeApp.Deliver(ctx, r)
}

// A new publish of an event handled before starts its history over, and that
// fresh start is durable before the call: a crash during the call must not
// leave the old "handled" history for the redelivery to be settled by.
func TestRenewedHistoryIsDurableBeforeTheCall(t *testing.T) {
	r := newRig(t, budget.Success)
	run(t, r.engine(4, r.delivery("evt-7")), func() bool { return len(r.snapshot()) >= 1 })
	k := journal.Key{Source: "fake", EventID: "evt-7"}
	if st, _ := r.journal.State(k); !st.Handled() {
		t.Fatalf("first publish not recorded as handled: %+v", st)
	}
	var handledDuring atomic.Bool
	e := r.engine(4, r.delivery("evt-7")) // a new publish: not redelivered
	e.o.Handler = stateApp{fakeApp: r.app, during: func() {
		if st, _ := r.journal.State(k); st.Handled() {
			handledDuring.Store(true)
		}
	}}
	run(t, e, func() bool { return len(r.snapshot()) >= 2 })
	if r.calls() != 2 {
		t.Fatalf("app calls = %d, want 2 (the new publish is handled again)", r.calls())
	}
	if handledDuring.Load() {
		t.Error("during the second call the journal still said handled: a crash there would settle the redelivery unseen")
	}
}
