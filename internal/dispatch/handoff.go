package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
)

// Window names a crash window of a hand-off: a point between two durable
// steps where a crash used to lose or duplicate work.
type Window string

const (
	// WindowHandled: the app answered success, recorded; not yet acked.
	WindowHandled Window = "handled-before-ack"
	// WindowPublished: the copy was published; its confirm not yet recorded.
	WindowPublished Window = "published-before-confirm"
	// WindowConfirmed: the copy's confirm was recorded; not yet acked.
	WindowConfirmed Window = "confirmed-before-ack"
)

// defaultCEType is the ce-type of messages that carry none.
const defaultCEType = "handoff.message"

// handoff is the walk of one delivery through the pipeline.
type handoff struct {
	e     *Engine
	r     *Route
	d     broker.Delivery
	msg   *broker.Message
	retry bool
	// intake is done once the engine stops taking messages: a delivery that
	// has not started its call by then is handed back, not started.
	intake context.Context
	trail  broker.Trail
	key    journal.Key
	// received is the RECEIVED record, written with the next record of the
	// hop so that the common path queues one write, not two.
	received journal.Record
	// renewed: this is a new publish of an event the journal has a history
	// for; a RENEWED record goes before RECEIVED so that history starts over.
	renewed bool
	// tok is the retry-budget token the next re-attempt holds: spent when
	// that attempt fails, given back when it succeeds or is never made.
	tok budget.Token
	log *slog.Logger // built on first use: most hand-offs never log
	// unreadable says why a message labelled as a structured CloudEvent is
	// not one: it is dead-lettered as malformed, never handed to the app.
	unreadable error
	// rootTrace and rootState are the trace context this hand-off started,
	// for a message that carried none: its copies carry it (see
	// startAttempt).
	rootTrace, rootState string
}

// logger returns the hand-off's logger, with its source and event id.
func (h *handoff) logger() *slog.Logger {
	if h.log == nil {
		h.log = h.e.log.With("source", h.r.Name, "event_id", h.trail.EventID)
	}
	return h.log
}

func (h *handoff) run(ctx context.Context) {
	e := h.e
	ok := h.readTrail()
	e.o.Observer.Received(h.r.Name, h.retry)
	unlock, err := e.keys.lock(ctx, h.key)
	if err != nil {
		e.handBack(h.d)
		return
	}
	defer unlock()
	if !ok {
		h.deadLetter(ctx, budget.ReasonMalformed)
		return
	}

	st, err := e.o.Journal.State(h.key)
	if err != nil {
		// One unreadable history must not stop the rest: go on as if new,
		// which at worst repeats work the journal would have saved.
		h.logger().Error("journal unreadable for this event; handling it as new", "err", err)
		st = journal.State{}
	}
	if h.resume(ctx, &st) {
		return
	}
	now := e.now()
	h.received = journal.Record{Kind: journal.Received, At: now, Hop: h.trail.Hops, Position: h.msg.Position}

	if h.retry && now.Before(h.trail.NextDue) {
		// Back before its due time (it needed a longer delay than the largest
		// tier): delay again; this is not an attempt.
		dec := e.o.Policy.Redelay(now, h.trail.NextDue)
		h.transfer(ctx, nil, broker.Destination{Tier: dec.Tier}, "redelay")
		return
	}
	if h.renewed && !h.journal(ctx) {
		// A new publish of an event handled before: its fresh start is
		// durable before the call, or a crash during the call would leave
		// the old history, and the redelivery would be settled as handled
		// although the app never answered this publish.
		return
	}
	if h.unreadable != nil {
		// After resume, like any failure: a redelivery whose copy is
		// confirmed is settled, not dead-lettered twice.
		h.trail.ErrorClass = string(budget.ReasonMalformed)
		h.trail.Error = "unreadable structured event: " + h.unreadable.Error()
		h.deadLetter(ctx, budget.ReasonMalformed)
		return
	}
	h.attempt(ctx)
}

// readTrail sets the delivery's trail and key. A copy whose handoff-*
// headers cannot be read returns false, with a trail that explains why and a
// key of its own, so the bad copy never writes into the real event's history.
func (h *handoff) readTrail() bool {
	h.unreadable = readEvent(h.msg)
	if h.retry {
		t, err := broker.ParseTrail(h.msg.Headers)
		if err == nil && t.Hops == 0 {
			err = fmt.Errorf("%s missing: every copy has one", broker.HeaderHops)
		}
		if err == nil {
			h.trail = t
			h.key = journal.Key{Source: h.r.Name, EventID: t.EventID, ReplayID: t.ReplayID}
			return true
		}
		id, _ := eventID(h.msg)
		if v := h.msg.Headers[broker.HeaderEventID]; v != "" {
			id = v
		}
		h.trail = broker.Trail{EventID: id, Origin: h.msg.Origin, ErrorClass: "malformed",
			Error: "unreadable handoff headers: " + err.Error()}
		h.key = journal.Key{Source: h.r.Name, EventID: id, ReplayID: "malformed"}
		return false
	}
	id, hashed := eventID(h.msg)
	// On a message's first entry the trail starts here: a producer's
	// handoff-* headers are not read, so it cannot forge attempts or
	// deadlines. Only a replayed copy's identity is (readReplay).
	h.trail = broker.Trail{EventID: id, Origin: h.msg.Origin}
	h.key = journal.Key{Source: h.r.Name, EventID: id}
	if h.readReplay() {
		return true
	}
	if hashed {
		h.logger().Warn("message has no id: using a content hash as its event id")
	}
	return true
}

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

// attempt calls the app until it answers (holding while it is unreachable)
// and carries out the decision; in-place retries loop here. A first attempt
// deposits into the retry budget; every later one waits for a token first.
func (h *handoff) attempt(ctx context.Context) {
	// A token taken for a call that was never made, or whose call
	// succeeded, goes back however the walk ends: shutdown, a lost
	// delivery, the deadline. Only a failed re-attempt keeps it spent.
	defer h.refund()
	e, p, t := h.e, h.e.o.Policy, &h.trail
	recorded := 0 // the attempt number whose ATTEMPT record is written
	budgeted := 0 // the attempt number the budget has seen
	for {
		now := e.now()
		if t.FirstAttemptAt.IsZero() {
			t.FirstAttemptAt = now
			t.Deadline = h.deadlineFor(now)
		}
		if !p.CanAttempt(now, t.Deadline) {
			h.deadLetter(ctx, budget.ReasonDeadline)
			return
		}
		next := t.Attempt + 1
		if budgeted != next && next > 1 && e.o.Budget != nil {
			if !h.token(ctx) {
				return
			}
			budgeted = next
			now = e.now()
			if !p.CanAttempt(now, t.Deadline) {
				h.deadLetter(ctx, budget.ReasonDeadline)
				return
			}
		}
		req := handler.Request{
			Message:     h.msg,
			EventID:     t.EventID,
			Source:      h.r.CESource,
			Type:        defaultCEType,
			Attempt:     next,
			Deadline:    t.Deadline,
			Redelivered: h.msg.Redelivered || t.ErrorClass == budget.Unknown.String(),
			ReplayID:    t.ReplayID,
			// The attempt's fields the gRPC request carries.
			FirstAttemptAt: t.FirstAttemptAt,
			Origin:         t.Origin,
		}
		if !h.acquire(ctx, next == 1) {
			// No call was made: nothing is written, so a redelivery is a
			// fresh attempt, not one cut short.
			return
		}
		if now = e.now(); !p.CanAttempt(now, t.Deadline) {
			// The deadline came while the walk waited for a slot.
			e.limiter.Release(0)
			h.deadLetter(ctx, budget.ReasonDeadline)
			return
		}
		req.Timeout = min(e.o.Timeout, t.Deadline.Sub(now))
		if recorded != req.Attempt {
			// Written once the call is sure to be made, before it: a crash
			// during the call leaves an attempt whose outcome is unknown.
			h.appendAsync(journal.Record{Kind: journal.Attempt, At: now, Hop: t.Hops, Attempt: req.Attempt})
			recorded = req.Attempt
		}
		if next == 1 && budgeted != 1 && e.o.Budget != nil {
			// Deposited once the call is sure to be made: a first attempt
			// held by a paused intake must not pay for re-attempts.
			e.o.Budget.Deposit()
			budgeted = 1
		}
		// The span lasts until the outcome is settled, and ends on every
		// way out below, once: before a hold or an in-place wait, neither
		// of which is this attempt's work.
		actx, span := h.startAttempt(ctx, &req)
		res := e.o.Handler.Deliver(ctx, &req)
		if ctx.Err() != nil {
			// Shutdown cut the call short: its result says nothing about the app.
			endAttempt(span, res)
			e.limiter.Release(0)
			h.handBack()
			return
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
			recorded = 0
			e.gate.hold(ctx)
			select {
			case <-ctx.Done():
				h.handBack()
				return
			case <-h.intake.Done():
				h.handBack()
				return
			case <-h.d.Lost():
				h.logger().Warn("delivery lost while the app was unreachable; the broker redelivers it")
				return
			case <-e.gate.openChan():
			}
			continue
		}
		// Settled under the attempt's span: the journal commit and the
		// copy's publish and confirm are part of what the attempt cost.
		due, again := h.decide(actx, req.Attempt, res, true)
		endAttempt(span, res)
		if !again || !h.wait(ctx, due) {
			return
		}
	}
}

// deadlineFor is the deadline of a message first attempted at first: the
// configured lifetime, or the producer's earlier handoff-deadline when it is
// trusted and this is the message's first entry.
func (h *handoff) deadlineFor(first time.Time) time.Time {
	var earlier time.Time
	if h.e.o.TrustProducerDeadline && !h.retry {
		if v := h.msg.Headers[broker.HeaderDeadline]; v != "" {
			d, err := time.Parse(time.RFC3339Nano, v)
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
		h.attempt(ctx)
	}
}

// wait holds the delivery, unsettled, until due; it reports false (having
// handed the delivery back, or left a lost one alone) when that ends first.
func (h *handoff) wait(ctx context.Context, due time.Time) bool {
	t := time.NewTimer(max(due.Sub(h.e.now()), 0))
	defer t.Stop()
	select {
	case <-t.C:
		h.trail.NextDue = time.Time{}
		return true
	case <-h.intake.Done():
		h.handBack()
	case <-ctx.Done():
		h.handBack()
	case <-h.d.Lost():
	}
	return false
}

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
		outcome = []journal.Record{{Kind: journal.Outcome, At: now, Hop: t.Hops, Attempt: attempt,
			Outcome: uint8(res.Outcome), Status: res.Status, Latency: res.Latency, Detail: res.Detail}}
	}
	switch dec.Action {
	case budget.Ack:
		// Handled: written down before the ack, so a redelivery after a
		// crash here is settled without calling the app again.
		if !h.journal(ctx, outcome...) {
			return time.Time{}, false
		}
		if res.Outcome == budget.Drop {
			h.logger().Info("app dropped message", "attempt", attempt)
		}
		if h.fault(WindowHandled) {
			return time.Time{}, false
		}
		h.reportReplayed(ctx)
		h.settle("handled")
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

// journal appends recs and waits for them to be durable. When that fails the
// crash-safety this walk depends on is gone: the engine stops, as a crash
// would, and the delivery stays unsettled for the broker to redeliver.
func (h *handoff) journal(ctx context.Context, recs ...journal.Record) bool {
	if pending := h.pending(); len(pending) > 0 {
		recs = append(pending, recs...)
	}
	if len(recs) == 0 {
		return true
	}
	span := h.startCommit(ctx, len(recs))
	err := h.e.o.Journal.Append(ctx, h.key, recs...)
	endCommit(span, err)
	switch {
	case err == nil:
		return true
	case ctx.Err() != nil:
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

// settle acks the delivery and reports whether the ack went out.
func (h *handoff) settle(why string) bool {
	if err := h.d.Ack(); err != nil {
		h.logger().Warn("ack failed; the broker will redeliver", "err", err)
		return false
	}
	h.appendAsync(journal.Record{Kind: journal.Settled, Hop: h.trail.Hops, Detail: why})
	return true
}

// appendAsync queues rec, after the hop's RECEIVED record if that is still
// unwritten.
func (h *handoff) appendAsync(rec journal.Record) {
	if pending := h.pending(); len(pending) > 0 {
		h.e.o.Journal.AppendAsync(h.key, append(pending, rec)...)
		return
	}
	h.e.o.Journal.AppendAsync(h.key, rec)
}

// pending takes the hop's RENEWED and RECEIVED records if still unwritten.
func (h *handoff) pending() []journal.Record {
	if h.received.Kind == 0 {
		return nil
	}
	var recs []journal.Record
	if h.renewed {
		recs = append(recs, journal.Record{Kind: journal.Renewed, At: h.received.At})
		h.renewed = false
	}
	recs = append(recs, h.received)
	h.received = journal.Record{}
	return recs
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
