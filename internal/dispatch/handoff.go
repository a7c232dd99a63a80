package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
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
	// received is the RECEIVED record, and attempted a first delivery's
	// ATTEMPT record, written with the next record of the hop: a first
	// attempt's with its outcome, so that the common path writes one part,
	// not two (see attempts).
	received, attempted journal.Record
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

	// space holds the walk's usual journal records (room is what is left
	// of them) and its first request (see records and request): with the
	// handoff itself in a walkState, or made on first use.
	space   *walkSpace
	room    []journal.Record
	reqUsed bool

	// What ends the walk (ended): its key lock, its turn in its sequence,
	// its place in the open set. later says the walk's goroutine left
	// them to the journal's commit (settleLater).
	kl      *keyLock
	leave   func()
	openSet *openSet
	openID  uint64
	later   bool
	ctx     context.Context // the walk's, for Committed and Answered
	// final: the delivery is on its final count (walk.final).
	final bool
	// slot: the walk holds a slot under the limiter, taken at admission
	// for its first call (Engine.admitSlot) and not yet used.
	slot bool
	// isolated is what the walk holds of the engine's isolation: nothing,
	// a share, or all of it for an alone call.
	isolated uint8

	// recorded is the attempt number whose ATTEMPT record is written, and
	// budgeted the one the budget has seen: attempt's loop's, kept here
	// for when an answer comes through Answered.
	recorded, budgeted int
	// call is the call handed to the deliverer with DeliverThen, until
	// its answer comes (Answered).
	call *handler.Request
	// syncOnly: the walk's goroutine waits on its calls, never hands them
	// over (a walk resumed from the journal's history, see attemptAfter).
	syncOnly bool

	// state is the walkState the handoff lives in, reused once the walk
	// ends; nil when something may still read it after that (see reuse).
	state *walkState
}

// ended releases what the walk held: the last thing a walk does, on its
// own goroutine or, after settleLater, on the journal's.
func (h *handoff) ended() {
	if h.kl != nil {
		h.e.keys.unlock(h.kl)
		h.kl = nil
	}
	h.unisolate()
	h.e.walkEnded(h.leave, h.openSet, h.openID, h.final)
	if ws := h.state; ws != nil {
		ws.release()
	}
}

// dropSlot gives back the slot admission took for the walk's first call,
// if it still holds it: the walk is about to wait for something else, or
// to end without a call.
func (h *handoff) dropSlot() {
	if h.slot {
		h.slot = false
		h.e.limiter.Release(0)
	}
}

// keep says the walk's state may be read after the walk ends, and so is not
// reused: a call cut short may leave its request with the deliverer (a
// batch still in flight).
func (h *handoff) keep() { h.state.kept = true }

// walkSpace is what a healthy message's walk needs of the heap — RECEIVED
// with ATTEMPT, OUTCOME and SETTLED for the journal, and the first call's
// request — in one allocation instead of one each.
type walkSpace struct {
	recs [4]journal.Record
	req  handler.Request
}

// walkState is a walk's handoff and its space, in one allocation: the
// handoff outlives its goroutine's walk when settleLater hands it over.
// Once the walk has ended and its goroutine has let go of it, nothing holds
// it — the journal copies the records it is given and drops a callback once
// called, a call's request is done with when the call returns — so it is
// reused: about 1.4 KB a message the collector no longer sweeps.
type walkState struct {
	h     handoff
	space walkSpace
	// refs counts who still uses it: the walk's goroutine, and the walk
	// until it ends, which after settleLater is the journal's goroutine.
	refs atomic.Int32
	// kept: something may read it after both are done (see keep).
	kept bool
}

var walkStates = sync.Pool{New: func() any { return new(walkState) }}

// newWalkState is a walkState for a walk, held by its goroutine and itself.
func newWalkState() *walkState {
	ws := walkStates.Get().(*walkState)
	ws.refs.Store(2)
	return ws
}

// release lets go of ws; the last to let go reuses it.
func (ws *walkState) release() {
	if ws.refs.Add(-1) != 0 || ws.kept {
		return
	}
	ws.h, ws.space = handoff{}, walkSpace{}
	walkStates.Put(ws)
}

func (h *handoff) walkSpace() *walkSpace {
	if h.space == nil {
		h.space = new(walkSpace)
		h.room = h.space.recs[:]
	}
	return h.space
}

// request returns a request for an attempt's call. The first is from the
// walk's space; a later one is new, because a call cut short may leave its
// request with the deliverer (a batch still in flight) after Deliver
// returns.
func (h *handoff) request() *handler.Request {
	if h.reqUsed {
		return new(handler.Request)
	}
	h.reqUsed = true
	return &h.walkSpace().req
}

// logger returns the hand-off's logger, with its source and event id.
func (h *handoff) logger() *slog.Logger {
	if h.log == nil {
		h.log = h.e.log.With("source", h.r.Name, "event_id", h.trail.EventID)
	}
	return h.log
}

// run walks the delivery; handedOver says its call's answer goes on with
// the walk (Answered), and the walk's goroutine must leave it alone.
func (h *handoff) run(ctx context.Context) (handedOver bool) {
	e := h.e
	ok := h.readTrail()
	if h.msg.Redelivered {
		// Handed out before: a call may have done the work. Every copy
		// made from here on says so.
		h.trail.Redelivered = true
	}
	e.o.Observer.Received(h.r.Name, h.retry)
	kl, err := e.keys.lock(ctx, h.key, h.dropSlot)
	if err != nil {
		e.handBack(h.d)
		return
	}
	h.kl = kl // unlocked by ended
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
	if st.Found {
		// Not the usual path: what the history asks for may wait, or
		// make no call, and the first call queues for its slot again.
		h.dropSlot()
	}
	if h.resume(ctx, &st) {
		return
	}
	if h.msg.FinalDelivery {
		// One more return and the broker drops it: not risked on a call.
		h.moveOut(ctx)
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
	if h.renewed {
		if !h.journal(ctx) {
			// A new publish of an event handled before: its fresh start is
			// durable before the call, or a crash during the call would
			// leave the old history, and the redelivery would be settled as
			// handled although the app never answered this publish.
			return
		}
		now = time.Time{} // the write took time: the attempt reads the clock
	}
	if max := e.o.MaxMessageBytes; max > 0 && len(h.msg.Body) > max {
		// Kept whole and never handed over: the app may not be able to
		// hold it, and a second copy of it here would double the memory
		// it takes. Like a failure, after resume.
		h.trail.ErrorClass = string(budget.ReasonTooLarge)
		h.trail.Error = fmt.Sprintf("message of %d bytes is larger than handler.max_message_bytes (%d)", len(h.msg.Body), max)
		h.deadLetter(ctx, budget.ReasonTooLarge)
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
	return h.attempt(ctx, now)
}

// readTrail sets the delivery's trail and key. A copy whose handoff-*
// headers cannot be read returns false, with a trail that explains why and a
// key of its own, so the bad copy never writes into the real event's history.
func (h *handoff) readTrail() bool {
	if max := h.e.o.MaxMessageBytes; max <= 0 || len(h.msg.Body) <= max {
		// A body too large to hand over is not parsed either: a structured
		// event's attributes would be a second copy of it.
		h.unreadable = readEvent(h.msg)
	}
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
