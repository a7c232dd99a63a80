package budget

import "sync"

// Intake decides when fresh messages stop being taken: when the retry budget
// is exhausted and the last Threshold first attempts all failed in a way that
// points at the app rather than the message (Retry, Overload, Unknown), more
// fresh messages would only turn into more waiting retries. The normal backlog
// then stays in the normal queue (seed 001: consumption failure is not a rate
// limiter). One success resumes intake. It is safe for concurrent use.
type Intake struct {
	threshold int

	mu     sync.Mutex
	streak int // first attempts failed in a row
	paused bool
}

// NewIntake returns an Intake that pauses after threshold failed first
// attempts in a row (at least 1).
func NewIntake(threshold int) *Intake { return &Intake{threshold: max(threshold, 1)} }

// Observe records an answer, first saying it answered a first attempt, and
// reports whether it moved intake: a success ends a pause; a failure pauses
// it when the failures go on and the budget is exhausted. exhausted is asked
// only once enough first attempts failed in a row (after a success, reading
// the budget is not worth its lock); nil never pauses. One call, one lock:
// it is on every answer's path.
func (i *Intake) Observe(o Outcome, first bool, exhausted func() bool) (changed bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	switch o {
	case Success, Drop:
		i.streak = 0
		changed, i.paused = i.paused, false
		return changed
	case Retry, Overload, Unknown:
		if first {
			i.streak++
		}
	}
	if !i.paused && i.streak >= i.threshold && exhausted != nil && exhausted() {
		i.paused = true
		return true
	}
	return false
}

// Paused reports whether fresh intake is paused.
func (i *Intake) Paused() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.paused
}
