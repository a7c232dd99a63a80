package deadletter

import "fmt"

// State is where a dead letter is in its life (DESIGN §7).
type State string

// The states of a dead letter.
const (
	// Pending: automatic retries stopped; to diagnose and fix.
	Pending State = "pending"
	// Approved: may be replayed, maybe with a repaired body.
	Approved State = "approved"
	// Replaying: a copy was published to the source under a replay id and
	// its outcome is not known yet.
	Replaying State = "replaying"
	// Done: the app handled the replayed copy.
	Done State = "done"
	// FailedReplay: the replayed copy failed again and became a new dead
	// letter, to which this one links.
	FailedReplay State = "failed-replay"
	// Terminated: closed by hand, not to be replayed.
	Terminated State = "terminated"
	// Expired: the DLQ's retention removed the dead letter before it was
	// closed.
	Expired State = "expired"
)

// States lists every state, in the order of a dead letter's life.
var States = []State{Pending, Approved, Replaying, Done, FailedReplay, Terminated, Expired}

// Closed reports whether s is final: nothing moves a dead letter out of it.
// The open count and the oldest open age are over the states that are not.
func (s State) Closed() bool {
	switch s {
	case Done, FailedReplay, Terminated, Expired:
		return true
	}
	return false
}

// Valid reports whether s is one of States.
func (s State) Valid() bool {
	for _, v := range States {
		if s == v {
			return true
		}
	}
	return false
}

// Transition is one change of state, one ledger record each.
type Transition string

// The transitions.
const (
	// Approve allows a replay; it may carry a repaired body. Approving an
	// approved dead letter again replaces its approval (a repair found wrong
	// before the replay is fixed the same way it was made).
	Approve Transition = "approve"
	// Replay records that a copy was published, confirmed, under a replay id.
	Replay Transition = "replay"
	// Complete records that the app handled the replayed copy.
	Complete Transition = "complete"
	// FailReplay records that the replayed copy became a new dead letter.
	FailReplay Transition = "fail-replay"
	// Terminate closes a dead letter by hand: pending, approved, or
	// replaying with no outcome recorded.
	Terminate Transition = "terminate"
	// Expire records that retention removed an open dead letter. Each
	// replica derives it from the DLQ's first offset; it is never written to
	// the ledger.
	Expire Transition = "expire"
)

// Transitions lists every transition.
var Transitions = []Transition{Approve, Replay, Complete, FailReplay, Terminate, Expire}

// Valid reports whether t is one of Transitions.
func (t Transition) Valid() bool {
	for _, v := range Transitions {
		if t == v {
			return true
		}
	}
	return false
}

// IllegalError is returned when a transition is not allowed from a state.
type IllegalError struct {
	From       State
	Transition Transition
}

func (e *IllegalError) Error() string {
	if e.From.Closed() {
		return fmt.Sprintf("cannot %s a dead letter that is %s: it is closed", e.Transition, e.From)
	}
	return fmt.Sprintf("cannot %s a dead letter that is %s", e.Transition, e.From)
}

// Is makes errors.Is(err, ErrIllegal) true for every IllegalError.
func (e *IllegalError) Is(target error) bool { return target == ErrIllegal }

// Decide is the one place that says whether t is legal from state from, and
// the state it leads to. An illegal or unknown transition returns an
// *IllegalError and from unchanged.
//
// Complete and FailReplay are legal from Approved as well as from Replaying:
// the replica that records a replay's Replay record and the replica that
// handles the replayed copy race, and the outcome's record can reach the
// ledger first. The late Replay record is then kept in the history, before
// the outcome it precedes, without changing the state (see lateReplay).
func Decide(from State, t Transition) (State, error) {
	to, ok := legal[from][t]
	if !ok {
		return from, &IllegalError{From: from, Transition: t}
	}
	return to, nil
}

// legal is the state machine: from → transition → to.
var legal = map[State]map[Transition]State{
	Pending: {
		Approve:   Approved,
		Terminate: Terminated,
		Expire:    Expired,
	},
	Approved: {
		Approve:    Approved,
		Replay:     Replaying,
		Complete:   Done,
		FailReplay: FailedReplay,
		Terminate:  Terminated,
		Expire:     Expired,
	},
	// A replaying letter may be terminated: when its copy's outcome was
	// never recorded (the replica that handled it could not reach the
	// ledger), the operator closes it after checking with the app, rather
	// than wait for retention to expire it.
	Replaying: {
		Complete:   Done,
		FailReplay: FailedReplay,
		Terminate:  Terminated,
		Expire:     Expired,
	},
}

// lateReplay reports where in l's history a Replay record of replayID goes
// when it reaches the ledger after the outcome of the copy it published (the
// handling replica was quicker than the runner): before that outcome, so
// the history reads approve → replay → complete, as it happened. The state
// stays the outcome's. ok is false when r is not such a record.
func lateReplay(l *Letter, t Transition, replayID string) (at int, ok bool) {
	if t != Replay || replayID == "" || (l.State != Done && l.State != FailedReplay) {
		return 0, false
	}
	for i := len(l.History) - 1; i >= 0; i-- {
		h := l.History[i]
		switch {
		case h.ReplayID != replayID:
			continue
		case h.Transition == Replay:
			return 0, false // recorded already
		case h.Transition == Complete || h.Transition == FailReplay:
			for j := i - 1; j >= 0; j-- {
				if l.History[j].Transition == Replay && l.History[j].ReplayID == replayID {
					return 0, false
				}
			}
			return i, true
		}
	}
	return 0, false
}
