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
// the app's capacity, and leave it alone. It is safe for concurrent use.
type Limiter struct {
	max int

	mu       sync.Mutex
	limit    float64
	inflight int
	changed  chan struct{} // closed and replaced when a slot may have freed
	waiting  bool          // someone holds changed: replace it on the next release
}

// decrease is the factor applied on Overload and Unknown.
const decrease = 0.9

// NewLimiter returns a limiter that starts, and tops out, at n.
func NewLimiter(n int) *Limiter {
	n = max(n, 1)
	return &Limiter{max: n, limit: float64(n), changed: make(chan struct{})}
}

// TryAcquire takes a slot when fewer than the limit are in flight.
func (l *Limiter) TryAcquire() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight >= int(l.limit) {
		return false
	}
	l.inflight++
	return true
}

// Changed is closed when a slot may have come free; take it again after
// each failed TryAcquire.
func (l *Limiter) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waiting = true
	return l.changed
}

// Release frees a slot and adapts the limit to the call's outcome; pass 0
// for a call that did not complete (shutdown), which leaves the limit alone.
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
	if l.waiting {
		close(l.changed)
		l.changed = make(chan struct{})
		l.waiting = false
	}
}

// Limit is the current limit.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.limit)
}

// InFlight is how many slots are taken.
func (l *Limiter) InFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight
}
