package dispatch

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/journal"
)

// reports keeps what Options.Replayed is told.
type reports struct {
	mu     sync.Mutex
	routes []string
	trails []broker.Trail
	// acked, when set, tells whether the delivery was acked already: a
	// report must come before the ack.
	acked    func() bool
	lateAcks int
}

func (p *reports) record(_ context.Context, route string, t broker.Trail) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.routes = append(p.routes, route)
	p.trails = append(p.trails, t)
	if p.acked != nil && p.acked() {
		p.lateAcks++
	}
}

func (p *reports) all() ([]string, []broker.Trail) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.routes...), append([]broker.Trail(nil), p.trails...)
}

// replayHeaders are what the dead-letter manager republishes a dead letter
// with, plus handoff-* headers the dead letter itself carried, which a
// republish drops but a producer could write.
func replayHeaders() broker.Headers {
	return broker.Headers{
		broker.HeaderEventID:  "evt-1",
		broker.HeaderReplayID: "r-1",
		broker.HeaderReplayOf: "orders.dlq/7",
		broker.HeaderAttempt:  "5",
		broker.HeaderHops:     "3",
		broker.HeaderDeadline: "2000-01-01T00:00:00.000Z",
	}
}

func ended(r *rig) func() bool {
	return func() bool {
		for _, ev := range r.snapshot() {
			if ev.kind == "ack" || ev.kind == "release" {
				return true
			}
		}
		return false
	}
}

// On its first entry a replayed copy is known by the event id and replay id
// it was republished with, and its journal history is the replay's own; the
// rest of its trail starts fresh. Without all three replay headers, or with
// one too long, a message is an ordinary one.
func TestFirstEntryReadsAReplayedCopysIdentity(t *testing.T) {
	long := strings.Repeat("x", maxReplayHeader+1)
	with := func(k, v string) broker.Headers {
		h := replayHeaders()
		if v == "" {
			delete(h, k)
		} else {
			h[k] = v
		}
		return h
	}
	tests := []struct {
		name     string
		headers  broker.Headers
		key      journal.Key
		replayID string
		reported bool
	}{
		{"replayed copy", replayHeaders(), journal.Key{Source: "fake", EventID: "evt-1", ReplayID: "r-1"}, "r-1", true},
		{"no replay-of", with(broker.HeaderReplayOf, ""), journal.Key{Source: "fake", EventID: "m-1"}, "", false},
		{"no replay id", with(broker.HeaderReplayID, ""), journal.Key{Source: "fake", EventID: "m-1"}, "", false},
		{"replay-of too long", with(broker.HeaderReplayOf, long), journal.Key{Source: "fake", EventID: "m-1"}, "", false},
		{"event id too long", with(broker.HeaderEventID, long), journal.Key{Source: "fake", EventID: "m-1"}, "", false},
		{"replay id at the bound", with(broker.HeaderReplayID, long[1:]),
			journal.Key{Source: "fake", EventID: "evt-1", ReplayID: long[1:]}, long[1:], true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t)
			app := &recordingApp{}
			var rep reports
			rep.acked = func() bool { return slices.Contains(kinds(r.snapshot()), "ack") }
			d := r.delivery("m-1")
			d.msg.Headers = tt.headers
			e := r.engineWith(app, func(o *Options) { o.Replayed = rep.record }, d)
			started := time.Now()
			run(t, e, ended(r))
			calls := app.calls()
			if len(calls) != 1 {
				t.Fatalf("app calls %d, events %v; want one call", len(calls), kinds(r.snapshot()))
			}
			req := calls[0]
			if req.EventID != tt.key.EventID || req.ReplayID != tt.replayID {
				t.Errorf("request event id %q replay id %q; want %q, %q", req.EventID, req.ReplayID, tt.key.EventID, tt.replayID)
			}
			// Fresh: the dead letter's attempts and deadline are not its.
			if req.Attempt != 1 || req.Deadline.Before(started) {
				t.Errorf("request attempt %d deadline %v; want attempt 1 and a deadline from now", req.Attempt, req.Deadline)
			}
			if st, err := r.journal.State(tt.key); err != nil || !st.Handled() {
				t.Errorf("journal under %v: %+v, %v; want it handled there", tt.key, st, err)
			}
			routes, trails := rep.all()
			if !tt.reported {
				if len(trails) != 0 {
					t.Errorf("reported %+v for an ordinary message", trails)
				}
				return
			}
			if len(trails) != 1 || routes[0] != "fake" {
				t.Fatalf("reported %v %+v; want the one replayed copy, on route fake", routes, trails)
			}
			if rep.lateAcks != 0 {
				t.Errorf("reported after the ack: a crash in between would lose the outcome")
			}
			if got := trails[0]; got.EventID != "evt-1" || got.ReplayID != tt.replayID || got.ReplayOf != "orders.dlq/7" {
				t.Errorf("reported trail %+v", got)
			}
		})
	}
}

// A crash after the app handled a replayed copy and before its ack leaves
// nothing reported; the redelivery is settled without calling the app, and
// reported then.
func TestReplayedCopyHandledBeforeACrashIsReportedOnItsRedelivery(t *testing.T) {
	r := newRig(t, budget.Success)
	var rep reports
	crash := func(w Window, _ journal.Key) error {
		if w == WindowHandled {
			return errors.New("crash")
		}
		return nil
	}
	d := r.delivery("m-1")
	d.msg.Headers = replayHeaders()
	e := r.engine(4, d)
	e.o.Replayed, e.o.Fault = rep.record, crash
	// Run drains the walk before it returns: it has stopped at the fault.
	run(t, e, func() bool { return r.calls() == 1 })
	if ev := r.snapshot(); len(ev) != 0 {
		t.Fatalf("events %v before the crash; want none", kinds(ev))
	}
	if _, trails := rep.all(); len(trails) != 0 {
		t.Fatalf("reported %+v for a copy never settled", trails)
	}

	again := r.delivery("m-1")
	again.msg.Headers = replayHeaders()
	again.msg.Redelivered = true
	e = r.engine(4, again)
	e.o.Replayed = rep.record
	run(t, e, ended(r))
	if got := kinds(r.snapshot()); len(got) != 1 || got[0] != "ack" {
		t.Fatalf("redelivery events %v; want one ack", got)
	}
	if r.calls() != 1 {
		t.Errorf("app calls %d; want 1: the app had handled it", r.calls())
	}
	if _, trails := rep.all(); len(trails) != 1 || trails[0].ReplayOf != "orders.dlq/7" || trails[0].ReplayID != "r-1" {
		t.Errorf("reported %+v; want the replayed copy once", trails)
	}
}

// A replay's copy published twice — a runner taken over after it published
// and before its record reached the ledger publishes it again — reaches the
// app once: the second copy, another message with the same replay id, is
// settled from the first one's history, and reported again.
func TestReplayedCopyPublishedTwiceReachesTheAppOnce(t *testing.T) {
	r := newRig(t, budget.Success)
	var rep reports
	first := r.delivery("m-1")
	first.msg.Headers = replayHeaders()
	e := r.engine(4, first)
	e.o.Replayed = rep.record
	run(t, e, ended(r))
	if r.calls() != 1 {
		t.Fatalf("app calls %d for the first copy; want 1", r.calls())
	}

	second := r.delivery("m-2") // a new publish, not a redelivery
	second.msg.Headers = replayHeaders()
	e = r.engine(4, second)
	e.o.Replayed = rep.record
	run(t, e, func() bool { return len(kinds(r.snapshot())) == 2 })
	if got := kinds(r.snapshot()); len(got) != 2 || got[1] != "ack" {
		t.Fatalf("events %v; want the second copy acked", got)
	}
	if r.calls() != 1 {
		t.Errorf("app calls %d; want 1: the second copy is the same replay of the same event", r.calls())
	}
	if _, trails := rep.all(); len(trails) != 2 || trails[1].ReplayID != "r-1" {
		t.Errorf("reported %+v; want the copy reported again on its second settle", trails)
	}

	// Another replay of the same event is new work.
	other := r.delivery("m-3")
	other.msg.Headers = replayHeaders()
	other.msg.Headers[broker.HeaderReplayID] = "r-2"
	e = r.engine(4, other)
	e.o.Replayed = rep.record
	run(t, e, func() bool { return len(kinds(r.snapshot())) == 3 })
	if r.calls() != 2 {
		t.Errorf("app calls %d; want 2: another replay reaches the app", r.calls())
	}
}

// A replayed copy moved on to a retry tier or the dead-letter destination is
// not reported; its copy carries the replay, so that its next hop is (or
// the new dead letter links the one it replayed).
func TestReplayedCopyMovedOnIsNotReported(t *testing.T) {
	tests := []struct {
		name    string
		outcome budget.Outcome
		dlq     bool
	}{
		{"retry", budget.Retry, false},
		{"dead letter", budget.Permanent, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.outcome)
			var rep reports
			d := r.delivery("m-1")
			d.msg.Headers = replayHeaders()
			e := r.engine(4, d)
			e.o.Replayed = rep.record
			run(t, e, ended(r))
			ev := r.snapshot()
			if len(ev) != 2 || ev[0].kind != "transfer" || ev[0].dest.DeadLetter != tt.dlq || ev[1].kind != "ack" {
				t.Fatalf("events %v; want a transfer (dead letter %v), then an ack", kinds(ev), tt.dlq)
			}
			tr := ev[0].trail
			if tr[broker.HeaderEventID] != "evt-1" || tr[broker.HeaderReplayID] != "r-1" || tr[broker.HeaderReplayOf] != "orders.dlq/7" {
				t.Errorf("copy trail %v; want the replay's event id, replay id and dead letter", tr)
			}
			if _, trails := rep.all(); len(trails) != 0 {
				t.Errorf("reported %+v for a copy moved on", trails)
			}
		})
	}
}

// A retry copy of a replayed copy that the app handles is reported: its
// trail still names the dead letter.
func TestRetryCopyOfAReplayIsReportedWhenHandled(t *testing.T) {
	r := newRig(t, budget.Success)
	var rep reports
	d := r.copyDelivery("evt-1")
	tr := broker.Trail{EventID: "evt-1", ReplayID: "r-1", ReplayOf: "orders.dlq/7", Attempt: 1, Hops: 1,
		FirstAttemptAt: time.Now(), Deadline: time.Now().Add(time.Hour)}
	d.msg.Headers = tr.Headers()
	e := r.engine(4, d)
	e.o.Replayed = rep.record
	run(t, e, ended(r))
	if _, trails := rep.all(); len(trails) != 1 || trails[0].ReplayOf != "orders.dlq/7" || trails[0].Hops != 1 {
		t.Errorf("reported %+v; want the retry copy of the replay", trails)
	}
	if st, _ := r.journal.State(journal.Key{Source: "fake", EventID: "evt-1", ReplayID: "r-1"}); !st.Handled() {
		t.Errorf("journal under the replay's key: %+v; want it handled", st)
	}
}

// A dead-letter copy says when it was made, by the engine's clock; a retry
// copy does not, even of a message that came with the header.
func TestDeadLetterCopySaysWhenItWasMade(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC)
	tests := []struct {
		name    string
		outcome budget.Outcome
		copy    bool // the message is a retry copy that came with the header
		want    string
	}{
		{"dead letter", budget.Permanent, false, at.Format(broker.TimeLayout)},
		{"retry", budget.Retry, false, ""},
		{"retry of a copy that came with it", budget.Retry, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.outcome)
			d := r.delivery("m-1")
			if tt.copy {
				d = r.copyDelivery("m-1")
				tr, err := broker.ParseTrail(d.msg.Headers)
				if err != nil {
					t.Fatal(err)
				}
				tr.DeadLetteredAt = at.Add(-time.Hour)
				d.msg.Headers = tr.Headers()
			}
			e := r.engine(4, d)
			e.now = func() time.Time { return at }
			run(t, e, ended(r))
			ev := r.snapshot()
			if len(ev) != 2 || ev[0].kind != "transfer" {
				t.Fatalf("events %v; want a transfer and an ack", kinds(ev))
			}
			if got := ev[0].trail[broker.HeaderDeadLetteredAt]; got != tt.want {
				t.Errorf("copy's %s = %q, want %q", broker.HeaderDeadLetteredAt, got, tt.want)
			}
		})
	}
}

// A dead-letter copy published again after a crash is the copy recorded
// before it: it says when it was first made, not when it was republished.
func TestDeadLetterCopyPublishedAgainKeepsItsTime(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	r := newRig(t, budget.Permanent)
	crash := func(w Window, _ journal.Key) error {
		if w == WindowPublished {
			return errors.New("crash")
		}
		return nil
	}
	e := r.engine(4, r.delivery("m-1"))
	e.now, e.o.Fault = func() time.Time { return at }, crash
	run(t, e, func() bool { return len(r.snapshot()) == 1 })
	st, err := r.journal.State(journal.Key{Source: "fake", EventID: "m-1"})
	if err != nil || st.Copy == nil || st.Copy.Confirmed {
		t.Fatalf("journal %+v, %v; want an unconfirmed copy", st, err)
	}
	want := at.Format(broker.TimeLayout)
	if got := st.Copy.Trail[broker.HeaderDeadLetteredAt]; got != want {
		t.Fatalf("recorded copy's %s = %q, want %q", broker.HeaderDeadLetteredAt, got, want)
	}

	again := r.delivery("m-1")
	again.msg.Redelivered = true
	e = r.engine(4, again)
	e.now = func() time.Time { return at.Add(time.Hour) }
	run(t, e, ended(r))
	ev := r.snapshot()
	if len(ev) != 3 || ev[1].kind != "transfer" || ev[2].kind != "ack" {
		t.Fatalf("events %v; want the copy, the copy again, an ack", kinds(ev))
	}
	if got := ev[1].trail[broker.HeaderDeadLetteredAt]; got != want {
		t.Errorf("republished copy's %s = %q, want %q (when it was first made)", broker.HeaderDeadLetteredAt, got, want)
	}
}
