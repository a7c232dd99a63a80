package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
)

// Settlement: the answer is written down, then the delivery is acked
// (WindowHandled) or its copy published (transfer.go). Nothing is acked
// before the journal holds what the ack stands for.

// decide turns the answer to attempt into an action and carries it out.
// record says whether the answer is new (and so goes in the journal). On an
// in-place retry it carries out nothing and returns when to attempt again.
func (h *handoff) decide(ctx context.Context, attempt int, res handler.Result, record bool) (time.Time, bool) {
	e, t := h.e, &h.trail
	now := e.now()
	dec := e.o.Policy.Decide(budget.Input{
		Outcome:        res.Outcome,
		Attempt:        attempt,
		Defers:         t.Defers,
		FirstAttemptAt: t.FirstAttemptAt,
		Deadline:       t.Deadline,
		RetryAfter:     res.RetryAfter,
		Now:            now,
	})
	t.Attempt = attempt
	if res.Outcome == budget.Defer {
		t.Defers++
	}
	if res.Outcome == budget.Unknown {
		t.Redelivered = true // its effect may have happened
	}
	if res.Outcome != budget.Success && res.Outcome != budget.Drop {
		if t.FirstFailureAt.IsZero() {
			t.FirstFailureAt = now
		}
		t.ErrorClass = res.Outcome.String()
		t.Error = res.Detail
	}
	if h.e.log.Enabled(ctx, slog.LevelDebug) {
		h.logger().Debug("attempt", "attempt", attempt, "outcome", res.Outcome, "status", res.Status,
			"latency", res.Latency, "action", dec.Action)
	}
	var outcome []journal.Record
	if record {
		// Room for the SETTLED record an ack adds (settleLater).
		outcome = append(make([]journal.Record, 0, 2), journal.Record{Kind: journal.Outcome, At: now, Hop: t.Hops, Attempt: attempt,
			Outcome: uint8(res.Outcome), Status: res.Status, Latency: res.Latency, Detail: res.Detail})
	}
	switch dec.Action {
	case budget.Ack:
		if res.Outcome == budget.Drop {
			h.logger().Info("app dropped message", "attempt", attempt)
		}
		if h.settleLater(ctx, outcome) {
			return time.Time{}, false
		}
		// Handled: written down before the ack, so a redelivery after a
		// crash here is settled without calling the app again.
		if !h.journal(ctx, outcome...) {
			return time.Time{}, false
		}
		if h.fault(WindowHandled) {
			return time.Time{}, false
		}
		h.reportReplayed(ctx)
		h.settle(handledWhy)
	case budget.Delay:
		t.NextDue = dec.Due
		if h.r.InPlace {
			// The message holds its place: nothing behind it in its
			// sequence runs meanwhile, and its offset is not committed.
			if len(outcome) > 0 {
				h.appendAsync(outcome[0])
			}
			return dec.Due, true
		}
		h.transfer(ctx, nil, broker.Destination{Tier: dec.Tier}, "retry", outcome...)
	case budget.DeadLetter:
		h.deadLetter(ctx, dec.Reason, outcome...)
	default:
		h.logger().Error("no action for outcome; handing message back", "outcome", res.Outcome)
		h.handBack()
	}
	return time.Time{}, false
}

// settleLater is decide's Ack when nothing needs the walk's goroutine until
// the outcome is durable: the records, SETTLED among them, are handed to
// the journal with the rest of the walk — the ack and the end of the walk —
// to run once they are committed, and the goroutine is free for the next
// delivery instead of parked through the commit. Not when the attempt's span
// is recorded (the commit is a span of its own under it) or a replayed copy
// is reported before its ack (a call that may wait on a broker). It
// reports whether it took the walk over.
func (h *handoff) settleLater(ctx context.Context, outcome []journal.Record) bool {
	later := h.e.later
	if later == nil || h.inAttempt(ctx) || h.trail.ReplayOf != "" {
		return false
	}
	// The SETTLED record goes in the same part as the outcome, ahead of
	// the ack it stands for: one part for a first-attempt success instead
	// of a second one after the ack. Nothing depends on it as proof of the
	// ack: a crash between the commit and the ack leaves a redelivery,
	// which the handled outcome settles without a call (the crash table's
	// first row) and records as settled again. What it gives up: such a
	// hand-off does not count as open (handled, not acked) at the next
	// start.
	if len(outcome) == 0 {
		return false // nothing new to write: acked at once (decide)
	}
	batch := h.batch(append(outcome, h.settledRecord(handledWhy))...)
	h.later, h.ctx = true, ctx
	if a, ok := h.d.(broker.Answered); ok {
		// Only the commit is left before the ack: the broker may hand out
		// another message in this one's place while it runs.
		a.Answered()
	}
	later.AppendThen(h.key, h, batch...)
	return true
}

// Committed is the rest of a walk settleLater handed to the journal: the
// ack, once the outcome is durable, and the walk's end. ctx is the walk's.
func (h *handoff) Committed(err error) {
	defer h.ended()
	if !h.committed(h.ctx, err) || h.fault(WindowHandled) {
		return
	}
	h.ack() // its SETTLED record was in the commit
}

// journal appends recs and waits for them to be durable. When that fails the
// crash-safety this walk depends on is gone: the engine stops, as a crash
// would, and the delivery stays unsettled for the broker to redeliver.
func (h *handoff) journal(ctx context.Context, recs ...journal.Record) bool {
	batch := h.batch(recs...)
	if len(batch) == 0 {
		return true
	}
	span := h.startCommit(ctx, len(batch))
	err := h.e.o.Journal.Append(ctx, h.key, batch...)
	endCommit(span, err)
	return h.committed(ctx, err)
}

// committed reports whether the walk goes on after its records' commit
// ended with err; when it does not, it has handed the delivery back or
// stopped the engine.
func (h *handoff) committed(ctx context.Context, err error) bool {
	switch {
	case err == nil:
		return true
	case ctx.Err() != nil:
		h.handBack()
	case errors.Is(err, journal.ErrNoRoom):
		// Nothing of it was written: the delivery goes back unsettled,
		// and intake waits until the journal can be written.
		h.logger().Warn("journal cannot be written; handing the delivery back", "err", err)
		h.e.journalCannotWrite(ctx)
		h.handBack()
	default:
		h.e.fail(fmt.Errorf("journal: %w", err))
	}
	return false
}

// fault reports whether a test fault stopped the hand-off at w.
func (h *handoff) fault(w Window) bool {
	if f := h.e.o.Fault; f != nil && f(w, h.key) != nil {
		h.logger().Warn("stopped by fault injection", "window", w)
		return true
	}
	return false
}

// handledWhy is the detail of a handled delivery's SETTLED record.
const handledWhy = "handled"

// settle acks the delivery, then records it settled, and reports whether
// the ack went out.
func (h *handoff) settle(why string) bool {
	if !h.ack() {
		return false
	}
	h.appendAsync(h.settledRecord(why))
	return true
}

// ack acks the delivery and reports whether the ack went out.
func (h *handoff) ack() bool {
	if err := h.d.Ack(); err != nil {
		h.logger().Warn("ack failed; the broker will redeliver", "err", err)
		return false
	}
	return true
}

func (h *handoff) settledRecord(why string) journal.Record {
	return journal.Record{Kind: journal.Settled, Hop: h.trail.Hops, Detail: why}
}

// appendAsync queues rec, after the hop's RECEIVED and ATTEMPT records if
// those are still unwritten.
func (h *handoff) appendAsync(rec journal.Record) {
	h.e.o.Journal.AppendAsync(h.key, h.batch(rec)...)
}

// batch is the hop's RENEWED, RECEIVED and ATTEMPT records, those still
// unwritten, then recs, in a slice of its own (see records).
func (h *handoff) batch(recs ...journal.Record) []journal.Record {
	n := len(recs)
	if h.received.Kind != 0 {
		n++
		if h.renewed {
			n++
		}
	}
	if h.attempted.Kind != 0 {
		n++
	}
	if n == 0 {
		return nil
	}
	out := h.records(n)
	if h.received.Kind != 0 {
		if h.renewed {
			out = append(out, journal.Record{Kind: journal.Renewed, At: h.received.At})
			h.renewed = false
		}
		out = append(out, h.received)
		h.received = journal.Record{}
	}
	if h.attempted.Kind != 0 {
		out = append(out, h.attempted)
		h.attempted = journal.Record{}
	}
	return append(out, recs...)
}

// records returns an empty slice with room for n records that no other
// call shares: the journal may keep a slice it was given until it is
// written, so none is handed over twice. A walk's usual records come from
// its space (walkSpace), not an allocation each.
func (h *handoff) records(n int) []journal.Record {
	if h.walkSpace(); n > len(h.room) {
		return make([]journal.Record, 0, n)
	}
	out := h.room[:0:n]
	h.room = h.room[n:]
	return out
}

func (h *handoff) settleDuplicate(why string) bool {
	h.logger().Info("settling a redelivery without calling the app", "hop", h.trail.Hops, "why", why)
	h.e.o.Observer.Duplicate(h.r.Name)
	return h.settle("duplicate: " + why)
}

func (h *handoff) handBack() {
	h.e.handBack(h.d)
	h.appendAsync(journal.Record{Kind: journal.Released, Hop: h.trail.Hops})
}
