package dispatch

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
)

// The attempt: the app's call, between the ATTEMPT record written before it
// and the answer. A crash in the call leaves an attempt whose outcome is
// unknown, and the redelivery's next call says Handoff-Redelivered.

// attempt calls the app until it answers (holding while it is unreachable)
// and carries out the decision; in-place retries loop here. A first attempt
// deposits into the retry budget; every later one waits for a token first.
// at, when not zero, is the time still for the first attempt: nothing
// waited since it was read. handedOver says the call's answer will continue
// the walk (Answered) and the walk's goroutine must leave the walk alone.
func (h *handoff) attempt(ctx context.Context, at time.Time) (handedOver bool) {
	h.recorded, h.budgeted = 0, 0
	return h.attempts(ctx, at)
}

// attempts is attempt's loop, entered again after an answer that came
// through Answered.
func (h *handoff) attempts(ctx context.Context, at time.Time) (handedOver bool) {
	defer func() {
		if !handedOver {
			h.attemptsEnded()
		}
	}()
	e, p, t := h.e, h.e.o.Policy, &h.trail
	for {
		now := at // the first attempt's only
		at = time.Time{}
		if now.IsZero() {
			now = e.now()
		}
		if t.FirstAttemptAt.IsZero() {
			t.FirstAttemptAt = now
			t.Deadline = h.deadlineFor(now)
		}
		if !p.CanAttempt(now, t.Deadline) {
			h.deadLetter(ctx, budget.ReasonDeadline)
			return
		}
		next := t.Attempt + 1
		if h.budgeted != next && next > 1 && e.o.Budget != nil {
			if !h.token(ctx) {
				return
			}
			h.budgeted = next
			now = e.now()
			if !p.CanAttempt(now, t.Deadline) {
				h.deadLetter(ctx, budget.ReasonDeadline)
				return
			}
		}
		req := h.request()
		// The trail's Redelivered is set by a redelivery (run) and an
		// unknown outcome (decide); a copy written by an earlier release
		// says the second only by its error class.
		*req = handler.Request{
			Message:     h.msg,
			EventID:     t.EventID,
			Source:      h.r.CESource,
			Type:        defaultCEType,
			Attempt:     next,
			Deadline:    t.Deadline,
			Redelivered: t.Redelivered || t.ErrorClass == budget.Unknown.String(),
			ReplayID:    t.ReplayID,
			// The attempt's fields the gRPC request carries.
			FirstAttemptAt: t.FirstAttemptAt,
			Origin:         t.Origin,
		}
		ok, waited := h.acquire(ctx, next == 1)
		if !ok {
			// No call was made: nothing is written, so a redelivery is a
			// fresh attempt, not one cut short.
			return
		}
		if waited {
			if now = e.now(); !p.CanAttempt(now, t.Deadline) {
				// The deadline came while the walk waited for a slot.
				e.limiter.Release(0)
				h.deadLetter(ctx, budget.ReasonDeadline)
				return
			}
		}
		// A message the sidecar stopped during often enough is called
		// alone (isolation.go).
		alone := t.Stops >= suspectStops
		if !h.isolate(ctx, alone) {
			e.limiter.Release(0)
			return
		}
		if !h.fenced(ctx) {
			// Stopping while the hand-out was being made durable: no call
			// was made, and nothing is written.
			e.limiter.Release(0)
			h.handBack()
			return
		}
		if alone {
			now = e.now() // it waited for the others
		}
		req.Timeout = min(e.o.Timeout, t.Deadline.Sub(now))
		if h.recorded != req.Attempt {
			rec := journal.Record{Kind: journal.Attempt, At: now, Hop: t.Hops, Attempt: req.Attempt}
			if alone {
				rec.Detail = journal.AttemptAlone
			}
			if h.msg.Redelivered || alone || h.mayHaveTwin() {
				// Durable before the call, once it is sure to be made: a
				// delivery that came back may be one that stops the
				// sidecar, and only a written attempt counts it (and says
				// it was alone); a crash during the call leaves an attempt
				// whose outcome is unknown. A twin, a new message to the
				// broker, learns of this call only from the journal.
				if !h.journal(ctx, rec) {
					e.limiter.Release(0)
					return
				}
			} else if req.Attempt == 1 {
				// A source message's first delivery's first is written
				// with what comes of the call, its outcome: one part for a
				// first-attempt success (DESIGN §2). Should the process
				// die in the call, the broker's redelivered flag or the
				// Kafka handed-out mark says the redelivery is a repeat,
				// and its attempt is written before its call.
				h.attempted = rec
			} else {
				// A later attempt in place: queued before the call, so
				// that a crash in it leaves the attempt counted.
				h.appendAsync(rec)
			}
			h.recorded = req.Attempt
		}
		if next == 1 && h.budgeted != 1 && e.o.Budget != nil {
			// Deposited once the call is sure to be made: a first attempt
			// held by a paused intake must not pay for re-attempts.
			e.o.Budget.Deposit()
			h.budgeted = 1
		}
		// The span lasts until the outcome is settled, and ends on every
		// way out below, once: before a hold or an in-place wait, neither
		// of which is this attempt's work.
		actx, span := h.startAttempt(ctx, req)
		if a := e.async; a != nil && span == nil && !h.syncOnly && h.trail.ReplayOf == "" {
			// No goroutine waits on the call: its answer continues the
			// walk (Answered). Nothing of h is touched after this.
			h.ctx, h.call = ctx, req
			a.DeliverThen(ctx, req, h)
			return true
		}
		res := e.o.Handler.Deliver(ctx, req)
		if !h.answered(ctx, actx, span, req, res) {
			return
		}
	}
}

// mayHaveTwin reports whether the broker may hold a second of this
// delivery, published anew: a copy the sidecar made (published again after
// a crash before its confirm), or an operator's replay of a dead letter
// (published again by a runner that took the replay over).
func (h *handoff) mayHaveTwin() bool { return h.retry || h.trail.ReplayID != "" }

// attemptsEnded is the end of attempt's loop, however it ends: a token
// taken for a call that was never made, or whose call succeeded, goes back
// (shutdown, a lost delivery, the deadline): only a failed re-attempt keeps
// it spent.
func (h *handoff) attemptsEnded() {
	if !h.later {
		// After settleLater the walk's end lets it go (ended).
		h.unisolate()
	}
	h.refund()
}

// answered carries out what the answer res to the call req asks for, and
// reports whether the attempt loop goes on.
func (h *handoff) answered(ctx, actx context.Context, span trace.Span, req *handler.Request, res handler.Result) bool {
	e, t := h.e, &h.trail
	if ctx.Err() != nil {
		// Shutdown cut the call short: its result says nothing about the
		// app, and its request may still be with the deliverer.
		h.keep()
		endAttempt(span, res)
		e.limiter.Release(0)
		h.handBack()
		return false
	}
	e.o.Observer.Attempted(h.r.Name, res.Outcome.String(), req.Attempt == 1, res.Latency)
	switch res.Outcome {
	case budget.Unreachable:
		// The call never reached the app: the token waits for the
		// call that does.
	case budget.Success, budget.Drop:
		// Useful work, not amplification: only failed re-attempts
		// spend the budget, so after an outage the waiting ones drain
		// at the app's pace, not the floor's.
		h.refund()
	default:
		h.tok = budget.Token{}
	}
	if res.Outcome != budget.Unreachable {
		// Before the slot frees: a pause this answer starts holds the
		// next first attempt, not the one after it.
		e.observe(res.Outcome, req.Attempt == 1, res.RetryAfter)
	}
	e.limiter.Release(res.Outcome)
	if res.Outcome == budget.Unreachable {
		endAttempt(span, res)
		// Written so that a restart knows this attempt never reached the
		// app and does not count it.
		h.appendAsync(journal.Record{Kind: journal.Outcome, Hop: t.Hops, Attempt: req.Attempt,
			Outcome: uint8(budget.Unreachable), Detail: res.Detail})
		h.recorded = 0
		h.unisolate()
		e.gate.hold(ctx)
		return await(h, ctx, h.intake.Done(), e.gate.openChan(), "delivery lost while the app was unreachable; the broker redelivers it")
	}
	// Settled under the attempt's span: the journal commit and the
	// copy's publish and confirm are part of what the attempt cost.
	due, again := h.decide(actx, req.Attempt, res, true)
	endAttempt(span, res)
	if !again {
		return false
	}
	h.unisolate() // not held through the wait
	return h.wait(ctx, due)
}

// Answered goes on with the walk whose call was handed to the deliverer
// with DeliverThen, once res is in: on the goroutine that has it (a
// batch's), when nothing that follows may wait — a success, which the
// journal's commit acks (settleLater) — else on a goroutine of its own.
// This goroutine is now the walk's, until the walk ends or hands over
// again.
func (h *handoff) Answered(res handler.Result) {
	if res.Outcome != budget.Success || h.ctx.Err() != nil {
		go h.goOn(res)
		return
	}
	h.goOn(res)
}

func (h *handoff) goOn(res handler.Result) {
	ws := h.state
	ctx, req := h.ctx, h.call
	h.call = nil
	if h.answered(ctx, ctx, nil, req, res) {
		if h.attempts(ctx, time.Time{}) {
			return
		}
	} else {
		h.attemptsEnded()
	}
	h.walkOver(ws)
}

// deadlineFor is the deadline of a message first attempted at first: the
// configured lifetime, or the producer's earlier handoff-deadline when it is
// trusted and this is the message's first entry.
func (h *handoff) deadlineFor(first time.Time) time.Time {
	var earlier time.Time
	if h.e.o.TrustProducerDeadline && !h.retry {
		if v := h.msg.Headers[broker.HeaderDeadline]; v != "" {
			d, err := broker.ParseTime(broker.HeaderDeadline, v)
			if err != nil {
				h.logger().Warn("producer deadline unreadable; using the configured one", "value", v)
			} else {
				earlier = d
			}
		}
	}
	return h.e.o.Policy.DeadlineFor(first, earlier)
}

// attemptAfter waits until due, then attempts.
func (h *handoff) attemptAfter(ctx context.Context, due time.Time) {
	if h.wait(ctx, due) {
		// The walk's goroutine goes on with the walk: its call waits.
		h.syncOnly = true
		h.attempt(ctx, time.Time{})
	}
}

// wait holds the delivery, unsettled, until due; it reports false (having
// handed the delivery back, or left a lost one alone) when that ends first.
func (h *handoff) wait(ctx context.Context, due time.Time) bool {
	h.dropSlot()
	t := time.NewTimer(max(due.Sub(h.e.now()), 0))
	defer t.Stop()
	if !await(h, ctx, h.intake.Done(), t.C, "") {
		return false
	}
	h.trail.NextDue = time.Time{}
	return true
}

// await waits for ch and reports whether it came before the walk had to
// end. The walk ends when ctx is done or intake stops (nil: the wait goes
// on through a stop of intake), and the delivery is handed back; or when
// the delivery is lost, which is left to the broker (and lost, when not
// empty, logged).
func await[T any](h *handoff, ctx context.Context, intake <-chan struct{}, ch <-chan T, lost string) bool {
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		h.handBack()
	case <-intake:
		h.handBack()
	case <-h.d.Lost():
		if lost != "" {
			h.logger().Warn(lost)
		}
	}
	return false
}

// fenced waits until the delivery's hand-out is durable (broker.Fenced),
// which a call must not precede; false when ctx ended first.
func (h *handoff) fenced(ctx context.Context) bool {
	f, ok := h.d.(broker.Fenced)
	if !ok {
		return true
	}
	ch := f.Durable()
	if ch == nil || isClosed(ch) {
		// Mostly durable by now. Read without the channel's lock, which a
		// select takes: one poll's deliveries share the channel.
		return true
	}
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}
