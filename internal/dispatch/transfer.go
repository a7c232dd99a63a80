package dispatch

import (
	"context"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/journal"
)

func (h *handoff) deadLetter(ctx context.Context, reason budget.Reason, before ...journal.Record) {
	h.trail.DeadReason = string(reason)
	h.trail.NextDue = time.Time{}
	// Set before the TRANSFERRING record, which keeps the copy's trail: a
	// copy published again after a crash says when it was first made.
	h.trail.DeadLetteredAt = h.e.now()
	h.logger().Info("dead-lettering", "reason", reason, "attempt", h.trail.Attempt, "error", h.trail.Error)
	h.transfer(ctx, nil, broker.Destination{DeadLetter: true}, "dead-letter", before...)
}

// Transfer backoff bounds: a failing transfer is retried for as long as the
// delivery is in hand.
const (
	transferBackoffMin = 100 * time.Millisecond
	transferBackoffMax = 5 * time.Second
)

// transfer makes the next hop's copy and settles this one: journal
// TRANSFERRING (with before, in the same commit), publish and wait for the
// broker's confirm, journal TRANSFERRED, and only then ack. trail, when not
// nil, is a copy's recorded headers to publish again exactly.
func (h *handoff) transfer(ctx context.Context, trail broker.Headers, dest broker.Destination, why string, before ...journal.Record) {
	h.dropSlot() // no call is made on this hop
	next := h.trail.Hops + 1
	if trail == nil {
		copyTrail := h.trail
		copyTrail.Hops = next
		if !dest.DeadLetter {
			// Only a dead-letter copy says when it was made: a retry copy
			// of a message that came with the header is no dead letter.
			copyTrail.DeadLetteredAt = time.Time{}
		}
		trail = copyTrail.Headers()
		if h.rootTrace != "" {
			// The message carried no trace context: its copy carries the one
			// its first attempt started, so the next attempt joins it.
			trail[headerTraceParent] = h.rootTrace
			if h.rootState != "" {
				trail[headerTraceState] = h.rootState
			}
		}
		// The copy is written down before it exists: after a crash the
		// journal says it may exist, and it is published again.
		recs := append(before, journal.Record{Kind: journal.Transferring, Hop: next, Attempt: copyTrail.Attempt,
			Dest: dest.String(), Detail: why, Trail: trail})
		if !h.journal(ctx, recs...) {
			return
		}
	}
	if !h.publish(ctx, dest, trail, why) {
		return
	}
	if h.fault(WindowPublished) {
		return
	}
	if !h.journal(ctx, journal.Record{Kind: journal.Transferred, Hop: next, Dest: dest.String()}) {
		return
	}
	if dest.DeadLetter {
		h.e.o.Observer.DeadLettered(h.r.Name, trail[broker.HeaderDeadReason])
	} else {
		h.e.o.Observer.Retried(h.r.Name, broker.TierName(dest.Tier))
	}
	if h.fault(WindowConfirmed) {
		return
	}
	h.settle("transferred to " + dest.String())
}

// publish publishes the copy until the broker confirms it, and reports
// whether it did; otherwise the delivery was handed back (shutdown) or lost.
func (h *handoff) publish(ctx context.Context, dest broker.Destination, trail broker.Headers, why string) bool {
	pctx, span := h.startPublish(ctx, dest)
	backoff := budget.NewBackoff(transferBackoffMin, transferBackoffMax)
	var failed error // the last try's, for the span
	for tries := 1; ; tries++ {
		err := h.r.Transfer.Transfer(pctx, dest, h.msg, trail)
		if err == nil {
			endPublish(span, tries, failed)
			return true
		}
		failed = err
		// Ack only after the copy is confirmed: acking first loses the
		// message if the copy never arrives.
		wait := backoff.Next()
		h.logger().Warn("transfer failed; source message stays unacked", "to", dest, "why", why, "err", err, "retry_in", wait)
		// Not handed back when intake stops: the copy may yet be
		// confirmed while in-flight messages drain.
		if !await(h, ctx, nil, time.After(wait), "delivery lost before its copy was transferred; the broker redelivers it") {
			endPublish(span, tries, err)
			return false
		}
	}
}
