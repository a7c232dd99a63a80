package dispatch

import (
	"context"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
)

// A delivery the journal has a history for: a redelivery after a crash, a
// lost ack, a duplicate copy, or a new publish of an event handled before.
// What the history says was done decides what is left to do.

// redelivery reports whether a first-entry message is the same delivery the
// journal has seen — redelivered by the broker, or the same log record — and
// not a new publish that happens to carry a known event id (a producer's
// resend, a dead letter moved back by an operator, identical content without
// an id). Only a redelivery may be settled from the journal's history: a new
// publish settled that way would be acked without reaching anyone.
func (h *handoff) redelivery(st *journal.State) bool {
	if h.retry {
		return true // copies are the sidecar's own: a second one is a duplicate
	}
	if h.trail.ReplayID != "" {
		// A replay publishes each dead letter once: a second copy of the
		// same replay is that copy again, published anew by a runner that
		// took the replay over before the first one's record reached the
		// ledger. Its history is its own (the key holds the replay id).
		return true
	}
	if h.msg.Position != "" {
		return st.Position == h.msg.Position
	}
	return h.msg.Redelivered
}

// resume settles or finishes a delivery that the journal says was dealt with
// before — a redelivery after a crash, a lost ack, a duplicate copy — and
// reports whether it did. Otherwise the delivery is new work.
func (h *handoff) resume(ctx context.Context, st *journal.State) bool {
	if !st.Found {
		return false
	}
	if !h.redelivery(st) {
		if st.Hop > 0 || st.Attempts > 0 || st.Copy != nil {
			h.logger().Info("a new publish of an event handled before: handling it again", "attempts_before", st.Attempts)
			h.renewed = true
		}
		return false
	}
	hop := h.trail.Hops
	switch {
	case st.Hop > hop || (st.Copy != nil && st.Copy.Hop > hop+1):
		h.settleDuplicate("a later copy of this event exists")
	case st.Copy != nil && st.Copy.Hop == hop+1 && st.Copy.Confirmed:
		h.settleDuplicate("its copy to " + st.Copy.Dest + " was already confirmed")
	case st.Copy != nil && st.Copy.Hop == hop+1:
		// The copy was being published when the process stopped: publish it
		// again, exactly; the retry consumer drops whichever comes second.
		dest, err := broker.ParseDestination(st.Copy.Dest)
		if err != nil {
			h.logger().Error("journal names an unknown destination; handling the message as new", "dest", st.Copy.Dest)
			return false
		}
		if !dest.DeadLetter {
			// The tiers may have changed since: the nearest one that exists
			// still brings the copy back no earlier than due.
			dest.Tier = h.e.o.Policy.Tier(dest.Tier)
		}
		if h.copyArrived(ctx, dest, st.Copy) {
			if h.journal(ctx, journal.Record{Kind: journal.Transferred, Hop: st.Copy.Hop, Dest: st.Copy.Dest, Detail: "found at the destination"}) {
				h.settleDuplicate("its unconfirmed copy to " + st.Copy.Dest + " was found there")
			}
			return true
		}
		h.logger().Info("publishing an unconfirmed copy again", "to", dest, "attempt", st.Copy.Attempt)
		h.transfer(ctx, st.Copy.Trail, dest, "unconfirmed copy")
	case st.Hop == hop && st.Handled():
		// Reported again: the first report may have been lost with the
		// process, between the ack and its record.
		h.reportReplayed(ctx)
		h.settleDuplicate("the app already handled it")
	case st.Hop == hop && st.HopAttempt > 0 && budget.Outcome(st.HopOutcome) == budget.Unreachable:
		// The app never took that call: no attempt was made.
		return false
	case st.Hop == hop && st.HopAttempt > 0:
		// The attempt started here and its answer is not recorded (the
		// process stopped during the call), or it failed and no copy was
		// begun. Decide on what is known; the next call says redelivered.
		t := &h.trail
		t.Attempt = st.HopAttempt
		if t.FirstAttemptAt.IsZero() {
			t.FirstAttemptAt = st.FirstAttemptAt
			t.Deadline = h.deadlineFor(st.FirstAttemptAt)
		}
		res := handler.Result{Outcome: budget.Unknown, Detail: "the sidecar stopped during this attempt; its outcome is unknown"}
		if st.HopOutcome != 0 {
			res = handler.Result{Outcome: budget.Outcome(st.HopOutcome), Detail: st.HopDetail}
		} else if !st.HopReleased && h.stopped(ctx, st) {
			return true
		}
		h.logger().Info("resuming an interrupted hand-off", "attempt", st.HopAttempt, "outcome", res.Outcome)
		if due, again := h.decide(ctx, st.HopAttempt, res, false); again {
			h.attemptAfter(ctx, due)
		}
	default:
		return false
	}
	return true
}

// copyArrived reports whether an unconfirmed copy can be found at its
// destination, when the destination can be read back at all.
func (h *handoff) copyArrived(ctx context.Context, dest broker.Destination, c *journal.Copy) bool {
	finder, ok := h.r.Transfer.(CopyFinder)
	if !ok {
		return false
	}
	found, err := finder.FindCopy(ctx, dest, c.Trail, c.At)
	if err != nil {
		h.logger().Warn("could not read the destination back; publishing the copy again", "to", dest, "err", err)
		return false
	}
	return found
}
