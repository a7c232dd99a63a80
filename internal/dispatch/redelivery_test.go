package dispatch

import (
	"context"
	"io"
	"log/slog"
	"maps"
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

// A source message's first delivery's ATTEMPT is written with its outcome,
// in one part, not queued before its call: during the call the journal
// holds nothing of it, even once a commit has landed. A delivery that came
// back has its attempt durable before its call (only a written attempt
// counts a stop), and so do a copy and a replay, whose twin (published
// again after a crash before its confirm, or by a runner that took the
// replay over) only the journal can tell that this call may have reached
// the app.
func TestAttemptWrittenBeforeTheCallOnlyWhenItCounts(t *testing.T) {
	cases := []struct {
		name   string
		mark   func(d *fakeDelivery)
		replay string // the replay id the hand-off's key holds
		before bool   // the attempt is in the journal during the call
	}{
		{name: "first delivery", mark: func(*fakeDelivery) {}},
		{name: "redelivered", mark: func(d *fakeDelivery) { d.msg.Redelivered = true }, before: true},
		{name: "copy", mark: func(d *fakeDelivery) {
			tr := broker.Trail{EventID: "evt-s", Attempt: 1, Hops: 1,
				FirstAttemptAt: time.Now(), Deadline: time.Now().Add(time.Hour)}
			d.msg.Copy, d.msg.Headers = true, tr.Headers()
		}, before: true},
		{name: "replay", mark: func(d *fakeDelivery) {
			d.msg.Headers = broker.Headers{broker.HeaderEventID: "evt-s", broker.HeaderReplayID: "rp-1",
				broker.HeaderReplayOf: "q.dlq/7"}
		}, replay: "rp-1", before: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, budget.Success)
			d := r.delivery("evt-s")
			c.mark(d)
			e := r.engine(4, d)
			var during journal.State
			var readErr error
			k := journal.Key{Source: "fake", EventID: "evt-s", ReplayID: c.replay}
			e.o.Handler = stateApp{fakeApp: r.app, during: func() {
				during, readErr = r.committedState(k)
			}}
			run(t, e, func() bool { return len(r.snapshot()) >= 1 })
			if readErr != nil {
				t.Fatal(readErr)
			}
			if got := during.HopAttempt > 0; got != c.before {
				t.Errorf("during the call the journal held the attempt: %v, want %v (state %+v)", got, c.before, during)
			}
			after, err := r.journal.State(k)
			if err != nil {
				t.Fatal(err)
			}
			if !after.Handled() || after.HopAttempt == 0 {
				t.Errorf("after the call: %+v, want its attempt handled", after)
			}
			if events := kinds(r.snapshot()); len(events) != 1 || events[0] != "ack" {
				t.Errorf("events %v, want [ack]", events)
			}
		})
	}
}

// redeliveredApp records each call's Handoff-Redelivered.
type redeliveredApp struct {
	*fakeApp
	flags *[]bool
}

func (a redeliveredApp) Deliver(ctx context.Context, r *handler.Request) handler.Result {
	a.fakeApp.mu.Lock()
	*a.flags = append(*a.flags, r.Redelivered)
	a.fakeApp.mu.Unlock()
	return a.fakeApp.Deliver(ctx, r)
}

// Once a call may have done the work without the sidecar learning of it (a
// redelivery, here), every later attempt says so, whatever the attempts
// between answered: the retry copy of a redelivered message that failed
// carries the flag, and its call says Handoff-Redelivered too.
func TestRedeliveredStaysSetAcrossHops(t *testing.T) {
	r := newRig(t, budget.Retry, budget.Success)
	var flags []bool
	d := r.delivery("evt-r")
	d.msg.Redelivered = true
	e := r.engine(4, d)
	e.o.Handler = redeliveredApp{fakeApp: r.app, flags: &flags}
	run(t, e, func() bool { return len(r.snapshot()) >= 2 })
	got := r.snapshot()
	if len(got) < 2 || got[0].kind != "transfer" {
		t.Fatalf("events %v, want a retry transfer first", kinds(got))
	}
	trail := got[0].trail
	if trail[broker.HeaderRedelivered] != "true" {
		t.Fatalf("retry copy's trail %v lacks %s: true", trail, broker.HeaderRedelivered)
	}

	copyD := r.delivery("evt-r")
	copyD.msg.Copy, copyD.msg.Headers = true, maps.Clone(trail)
	delete(copyD.msg.Headers, broker.HeaderNextDue) // due now
	e2 := r.engine(4, copyD)
	e2.o.Handler = redeliveredApp{fakeApp: r.app, flags: &flags}
	run(t, e2, func() bool { return len(r.snapshot()) >= 3 })
	r.app.mu.Lock()
	defer r.app.mu.Unlock()
	if len(flags) != 2 || !flags[0] || !flags[1] {
		t.Errorf("calls' Handoff-Redelivered %v, want [true true]: the copy's call must say an earlier attempt may have done the work", flags)
	}
}

// A retry in place (the message holds its place) is not a first attempt:
// its ATTEMPT record is queued before its call, as before, so that a crash
// during it leaves the attempt counted.
func TestInPlaceRetryQueuesItsAttemptBeforeTheCall(t *testing.T) {
	r := newRig(t, budget.Retry, budget.Success)
	d := r.delivery("evt-p")
	e := r.engine(4, d)
	e.o.Routes[0].InPlace = true
	var calls int
	var during journal.State
	var readErr error
	e.o.Handler = stateApp{fakeApp: r.app, during: func() {
		if calls++; calls == 2 {
			during, readErr = r.committedState(journal.Key{Source: "fake", EventID: "evt-p"})
		}
	}}
	run(t, e, func() bool { return len(r.snapshot()) >= 1 })
	if readErr != nil {
		t.Fatal(readErr)
	}
	if calls != 2 || during.HopAttempt != 2 {
		t.Errorf("calls %d; during the second call the journal held attempt %d, want 2 (state %+v)", calls, during.HopAttempt, during)
	}
}

// committedState is the journal's state of k once whatever was queued so
// far is committed: a waited write of another event commits it.
func (r *rig) committedState(k journal.Key) (journal.State, error) {
	if err := r.journal.Append(context.Background(), journal.Key{Source: "fake", EventID: "other"},
		journal.Record{Kind: journal.Received}); err != nil {
		return journal.State{}, err
	}
	return r.journal.State(k)
}
