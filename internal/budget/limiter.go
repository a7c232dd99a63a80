package budget

import (
	"math"
	"sync"
)

// Limiter bounds the calls to the app in flight with an adaptive limit,
// AIMD as in TCP congestion control: an Overload or Unknown answer cuts the
// limit by a tenth (multiplicative decrease), a Success raises it by 1/limit
// (about one per limit's worth of successes: additive increase), always
// between 1 and Max. Other answers say something about the message, not about
// the app's capacity, and leave it alone. Callers that find no slot free
// queue for one and are served in arrival order: a freed slot goes to the
// first of them, and wakes no one else. It is safe for concurrent use.
type Limiter struct {
	max int

	mu       sync.Mutex
	limit    float64
	inflight int
	queue    []*Waiter // in arrival order from head; withdrawn ones are skipped
	head     int
}

// Waiter is a caller's place in the limiter's queue.
type Waiter struct {
	l       *Limiter
	ready   chan struct{} // closed once a slot is the waiter's; sent on, when reused
	granted bool          // a slot was taken for it and Cancel has not freed it; under l.mu
	gone    bool          // cancelled; under l.mu
	// reused: a caller's one waiter, queued again after each slot
	// (AcquireAgain); ready is buffered and signalled, not closed.
	reused bool
	queued bool // in the queue; under l.mu
}

// Ready is closed once a slot has been taken for the waiter: it holds the
// slot from then on, and frees it with Release like any other. A reused
// waiter's (AcquireAgain) receives once for each slot instead.
func (w *Waiter) Ready() <-chan struct{} { return w.ready }

// Cancel is for a waiter that gives up instead of using its slot: it leaves
// the queue, and a slot already taken for it is freed for the next in line,
// so it is right whether or not Ready fired. A slot that was used is freed
// with Release, never with Cancel.
func (w *Waiter) Cancel() {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case w.granted:
		w.granted, w.gone = false, true
		if w.reused {
			select {
			case <-w.ready: // the slot's signal, if not received
			default:
			}
		}
		l.inflight--
		l.grant()
	default:
		w.gone = true
	}
}

// decrease is the factor applied on Overload and Unknown.
const decrease = 0.9

// NewLimiter returns a limiter that starts, and tops out, at n.
func NewLimiter(n int) *Limiter {
	n = max(n, 1)
	return &Limiter{max: n, limit: float64(n)}
}

// TryAcquire takes a slot when fewer than the limit are in flight. It never
// takes one ahead of a queued caller: a slot that frees while callers wait
// is theirs.
func (l *Limiter) TryAcquire() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.take()
}

// Acquire takes a slot when one is free (ok), or else queues the caller and
// returns its place: a slot is taken for it, in arrival order, as one frees.
func (l *Limiter) Acquire() (w *Waiter, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.take() {
		return nil, true
	}
	w = &Waiter{l: l, ready: make(chan struct{})}
	l.queue = append(l.queue, w)
	return w, false
}

// NewWaiter returns a waiter for AcquireAgain: one caller that queues for
// one slot at a time (a source taking deliveries) reuses it instead of
// making a waiter and its channel each time it waits.
func (l *Limiter) NewWaiter() *Waiter {
	return &Waiter{l: l, ready: make(chan struct{}, 1), reused: true}
}

// AcquireAgain is Acquire with w, made by NewWaiter, as the caller's place:
// ok when a slot was free, or else w is queued and its Ready receives once
// a slot is its. A waiter that received its slot may queue again; one
// cancelled may not (its old place may still be in the queue): the
// caller makes a new one.
func (l *Limiter) AcquireAgain(w *Waiter) (ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.gone || w.queued {
		panic("budget: a cancelled or queued waiter queued again")
	}
	w.granted = false
	if l.take() {
		return true
	}
	w.queued = true
	l.queue = append(l.queue, w)
	return false
}

// take takes a free slot; l.mu is held. Slots are handed to the queue as
// they free, so none is free while anyone waits.
func (l *Limiter) take() bool {
	if l.inflight >= int(l.limit) {
		return false
	}
	l.inflight++
	return true
}

// grant hands free slots to the queue in order; l.mu is held.
func (l *Limiter) grant() {
	for l.inflight < int(l.limit) && l.head < len(l.queue) {
		w := l.queue[l.head]
		l.queue[l.head] = nil
		l.head++
		switch {
		case l.head == len(l.queue):
			// Empty: start again at the array's start, so a queue of a
			// waiter or two at a time never grows it.
			l.queue, l.head = l.queue[:0], 0
		case l.head >= 64 && l.head >= len(l.queue)/2:
			// Mostly served: move the rest to the start.
			n := copy(l.queue, l.queue[l.head:])
			clear(l.queue[n:])
			l.queue, l.head = l.queue[:n], 0
		}
		w.queued = false
		if w.gone {
			continue
		}
		w.granted = true
		l.inflight++
		if w.reused {
			w.ready <- struct{}{}
		} else {
			close(w.ready)
		}
	}
}

// Release frees a slot and adapts the limit to the call's outcome; pass 0
// for a call that did not complete (shutdown), or a slot given back unused,
// which leaves the limit alone.
func (l *Limiter) Release(o Outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	switch o {
	case Overload, Unknown:
		l.limit = math.Max(1, math.Floor(l.limit*decrease))
	case Success:
		l.limit = math.Min(float64(l.max), l.limit+1/l.limit)
	}
	l.grant()
}

// Limit is the current limit.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.limit)
}

// Queued is how many callers wait for a slot.
func (l *Limiter) Queued() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, w := range l.queue[l.head:] {
		if !w.gone {
			n++
		}
	}
	return n
}

// InFlight is how many slots are taken.
func (l *Limiter) InFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight
}
