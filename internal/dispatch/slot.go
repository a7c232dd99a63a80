package dispatch

import (
	"context"
	"time"

	"handoff.dev/handoff/internal/budget"
)

// What an attempt waits for before its call: a retry-budget token for a
// re-attempt, and a slot under the adaptive concurrency limit.

// token waits for a retry-budget token for a re-attempt. It reports false
// when the walk ends first: dead-lettered because the deadline came (a
// re-attempt is never dropped for lack of a token, only for its own
// deadline), handed back at shutdown, or lost.
func (h *handoff) token(ctx context.Context) bool {
	b := h.e.o.Budget
	tok, changed, recheck := b.Poll(true)
	if tok.Taken() {
		h.tok = tok
		return true
	}
	dl := time.NewTimer(max(h.trail.Deadline.Add(-h.e.o.Policy.MinAttempt).Sub(h.e.now()), 0))
	defer dl.Stop()
	slot := time.NewTimer(recheck)
	defer slot.Stop()
	for {
		select {
		case <-changed:
		case <-slot.C:
		case <-dl.C:
			h.deadLetter(ctx, budget.ReasonDeadline)
			return false
		case <-ctx.Done():
			h.handBack()
			return false
		case <-h.intake.Done():
			h.handBack()
			return false
		case <-h.d.Lost():
			return false
		}
		if tok, changed, recheck = b.Poll(false); tok.Taken() {
			h.tok = tok
			return true
		}
		slot.Reset(recheck)
	}
}

// refund gives back the token of a re-attempt that succeeded or was never
// made.
func (h *handoff) refund() {
	if h.tok.Taken() {
		h.e.o.Budget.Refund(h.tok)
		h.tok = budget.Token{}
	}
}

// acquire takes a slot for a call to the app, under the adaptive limit and
// after any pause an Overload answer's Retry-After asked for; true means the
// walk holds a slot, which the call's Release frees. Walks that find no slot
// free queue for one in arrival order. A first attempt also waits while fresh
// intake is paused (the budget is spent and first attempts keep failing),
// unless a probe lets it through: the message stays unsettled, holding its
// prefetch slot, so the broker keeps the backlog. A slot that comes while a
// pause begins is given back, and the walk waits out the pause and queues
// again. It gives up, handing the delivery back, when intake stops or ctx is
// done, and leaves a lost delivery alone. waited says whether it had to wait
// for the slot: the clock and the deadline have moved only then. A plain
// delivery's first attempt mostly comes with its slot, taken at admission
// (Engine.admitSlot), and waits here only while calls are paused.
func (h *handoff) acquire(ctx context.Context, first bool) (ok, waited bool) {
	e := h.e
	// held: the walk holds a slot, given by the limiter's queue while it
	// waited, or taken at its admission.
	held := h.slot
	h.slot = false
	giveBack := func() {
		if held {
			e.limiter.Release(0)
			held = false
		}
	}
	for {
		if h.intake.Err() != nil || ctx.Err() != nil {
			giveBack()
			h.handBack()
			return false, waited
		}
		if isClosed(h.d.Lost()) {
			giveBack()
			return false, waited
		}
		var wake, probe, slot <-chan struct{}
		var queued *budget.Waiter
		var timer <-chan time.Time
		var stop func() bool
		var fresh <-chan struct{} // only first attempts wait for fresh intake
		if first {
			fresh = e.fresh.openChan()
		}
		var d time.Duration // an app's Retry-After still holding every call
		if until := e.overloadUntil.Load(); until != 0 {
			d = time.Duration(until - e.now().UnixNano())
		}
		switch {
		case first && !isClosed(fresh):
			// Paused: wait for intake to resume or for a probe turn.
			giveBack()
			wake, probe = fresh, e.fresh.probe
		case d > 0:
			giveBack()
			t := time.NewTimer(d)
			timer, stop = t.C, t.Stop
		default:
			if held {
				return true, waited
			}
			w, ok := e.limiter.Acquire()
			if ok {
				return true, waited
			}
			queued, slot = w, w.Ready()
		}
		ok := true
		waited = true
		select {
		case <-slot:
			// Ours; the loop checks once more that intake, ctx and the
			// delivery are still live and that nothing paused calls.
			held = true
		case <-wake:
		case <-probe:
			first = false // this one is the probe
		case <-timer:
		case <-h.intake.Done():
			h.handBack()
			ok = false
		case <-ctx.Done():
			h.handBack()
			ok = false
		case <-h.d.Lost():
			ok = false
		}
		if stop != nil {
			stop()
		}
		if !ok {
			if queued != nil {
				queued.Cancel() // frees the slot too, had it just come
			}
			return false, waited
		}
	}
}
