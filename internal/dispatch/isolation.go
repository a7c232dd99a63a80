package dispatch

import (
	"context"
	"fmt"
	"sync"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/journal"
)

// A message whose call the sidecar died in (a crash loop: a body that
// makes the process run out of memory, a handler bug that takes the pod
// down) looks, after the restart, like every other call that was in flight
// then. One stop says little: a pod killed from outside leaves every call
// in flight with one. A message in flight at suspectStops stops is called
// alone from then on: its call waits until no other is in flight or
// unsettled, and holds the others off while it runs. If the sidecar dies
// during killerStops such calls, the message's own call is the cause: it
// is dead-lettered as delivery-limit, with the stops as its evidence,
// before the broker's own delivery limit drops it.
//
// Suspects are few, so the alone calls after a restart are few: had every
// call in flight at one stop been called alone, a restart would spend its
// first seconds calling them one by one, and kills from outside landing
// in that stretch (a rollout, a node drained) would each be blamed on the
// message alone at the time; two such and a healthy message was
// dead-lettered.
//
// A quorum queue counts every return of a message, and a crash returns the
// whole unacked window: messages never called are counted too. A delivery
// on its final count (broker.Message.FinalDelivery) is therefore never
// called; it is moved to a retry tier as a copy, whose count starts again.

// suspectStops is how many stops a message must have been in flight at
// before it is called alone.
const suspectStops = 2

// killerStops is how many alone calls a message may be in when the sidecar
// stops before it is taken for the cause. One could be chance (a node
// drained, an unrelated crash); two alone, after two shared, are not.
const killerStops = 2

// isolation keeps alone calls alone: every other call holds it shared from
// its slot to its settle.
type isolation struct {
	rw sync.RWMutex

	mu     sync.Mutex
	finals int           // final deliveries admitted and not yet ended
	quiet  chan struct{} // closed while finals is 0
}

func newIsolation() *isolation {
	i := &isolation{quiet: make(chan struct{})}
	close(i.quiet)
	return i
}

// finalIn counts a final delivery in; finalOut out.
func (i *isolation) finalIn() {
	i.mu.Lock()
	if i.finals == 0 {
		i.quiet = make(chan struct{})
	}
	i.finals++
	i.mu.Unlock()
}

func (i *isolation) finalOut() {
	i.mu.Lock()
	if i.finals--; i.finals == 0 {
		close(i.quiet)
	}
	i.mu.Unlock()
}

// noFinals is closed once no final delivery is being moved out: an alone
// call that kills the sidecar would return them past their limit.
func (i *isolation) noFinals() <-chan struct{} {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.quiet
}

// Isolation states of a walk.
const (
	notIsolated uint8 = iota
	sharedCall
	aloneCall
)

// isolate takes the isolation for the call about to be made: alone, or
// shared with every other call. false: the walk ended while it waited.
func (h *handoff) isolate(ctx context.Context, alone bool) bool {
	iso := h.e.iso
	if !alone {
		iso.rw.RLock()
		h.isolated = sharedCall
		return true
	}
	if !await(h, ctx, h.intake.Done(), iso.noFinals(), "delivery lost while waiting to be called alone; the broker redelivers it") {
		return false
	}
	h.logger().Info("calling alone: the sidecar stopped during this message's call before", "stops", h.trail.Stops, "alone_stops", h.trail.AloneStops)
	iso.rw.Lock()
	h.isolated = aloneCall
	return true
}

// unisolate lets the isolation go, if the walk holds it.
func (h *handoff) unisolate() {
	switch h.isolated {
	case sharedCall:
		h.e.iso.rw.RUnlock()
	case aloneCall:
		h.e.iso.rw.Unlock()
	}
	h.isolated = notIsolated
}

// stopped folds an attempt the process stopped during into the trail, and
// reports whether the message is taken for the cause of the stops: it is
// dead-lettered, and the walk is over.
func (h *handoff) stopped(ctx context.Context, st *journal.State) bool {
	t := &h.trail
	t.Stops++
	if st.HopAlone {
		t.AloneStops++
	}
	if t.AloneStops < killerStops {
		return false
	}
	t.ErrorClass = string(budget.ReasonDeliveryLimit)
	t.Error = fmt.Sprintf("the sidecar stopped during %d of this message's calls, %d of them made alone with nothing else in flight; called again it would go on stopping it until the queue's delivery limit drops it", t.Stops, t.AloneStops)
	h.logger().Error("dead-lettering a message whose calls stop the sidecar", "stops", t.Stops, "alone_stops", t.AloneStops)
	h.deadLetter(ctx, budget.ReasonDeliveryLimit)
	return true
}

// moveOut takes a delivery on its final count out of the broker's count
// without calling the app: a retry copy to the first tier, confirmed, then
// the ack. The copy is a new message to the broker, its deliveries counted
// from none; its trail keeps the attempts and stops so far.
func (h *handoff) moveOut(ctx context.Context) {
	e, t := h.e, &h.trail
	if t.FirstAttemptAt.IsZero() {
		// Never attempted: its time starts now, as it would at the call.
		now := e.now()
		t.FirstAttemptAt = now
		t.Deadline = h.deadlineFor(now)
	}
	h.logger().Warn("final delivery before the queue's delivery limit: moving it to a retry tier uncalled",
		"delivery_count", h.msg.DeliveryCount, "attempt", t.Attempt)
	h.transfer(ctx, nil, broker.Destination{Tier: e.o.Policy.Tier(0)}, "delivery limit near")
}
