package budget

import (
	"time"
)

// Action is what to do with a message after an answer.
type Action uint8

const (
	// Ack settles the message: it is done.
	Ack Action = iota + 1
	// Delay transfers a copy to a delay tier, due at Decision.Due, then settles
	// the original.
	Delay
	// DeadLetter transfers a copy to the dead-letter queue, then settles the
	// original.
	DeadLetter
	// Hold keeps the message unsettled and calls the app again once it is
	// reachable; no attempt is burned.
	Hold
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Delay:
		return "retry"
	case DeadLetter:
		return "dead-letter"
	case Hold:
		return "hold"
	}
	return "action(?)"
}

// Reason says why a message was dead-lettered. It is written to the copy's
// handoff-dead-reason header.
type Reason string

const (
	ReasonPermanent    Reason = "permanent"
	ReasonMaxAttempts  Reason = "max-attempts"
	ReasonDeadline     Reason = "deadline"
	ReasonDeferExpired Reason = "defer-expired"
	// ReasonMalformed: a copy the sidecar itself wrote came back with
	// handoff-* headers it cannot read, or a message labelled as a
	// structured CloudEvent is not one; it is kept, not guessed at.
	ReasonMalformed Reason = "malformed"
	// ReasonTooLarge: the message's body is larger than the handler takes
	// (handler.max_message_bytes); it is kept whole, never handed over.
	ReasonTooLarge Reason = "too-large"
	// ReasonDeliveryLimit: the sidecar stopped during the message's call
	// every time it was called alone, nothing else in flight; one more
	// return would count toward the queue's delivery limit, after which the
	// broker drops it. It is kept here instead, with its evidence.
	ReasonDeliveryLimit Reason = "delivery-limit"
)

// Policy is the retry configuration. The zero value is not usable; build it
// from config and call Validate there.
type Policy struct {
	MaxAttempts int             // all attempts, including the first
	Base, Cap   time.Duration   // full-jitter backoff: random[0, min(Cap, Base·2^k)]
	Tiers       []time.Duration // ascending delay tiers
	Deadline    time.Duration   // message lifetime from its first attempt
	DeferMaxAge time.Duration   // how long Defer answers may go on, from the first attempt
	// MinAttempt is the least time left before the deadline that still makes
	// an attempt worth starting.
	MinAttempt time.Duration
	// Jitter returns a float in [0, 1). Tests pass a fixed one.
	Jitter func() float64
}

// Input is everything Decide looks at for one answer.
type Input struct {
	Outcome Outcome
	// Attempt is the attempt that just ran, 1-based, counted across hops.
	Attempt int
	// Defers counts earlier Defer answers (not this one).
	Defers         int
	FirstAttemptAt time.Time
	Deadline       time.Time
	// RetryAfter is the app's Retry-After, zero when absent.
	RetryAfter time.Duration
	Now        time.Time
}

// Decision is the one action for an answer.
type Decision struct {
	Action Action
	// Tier is the delay tier to transfer to (Delay only).
	Tier time.Duration
	// Due is the earliest time of the next attempt (Delay only).
	Due    time.Time
	Reason Reason // DeadLetter only
}

// DeadlineFor is the absolute deadline of a message first attempted at
// first: the configured lifetime, or an earlier limit the caller trusts.
func (p *Policy) DeadlineFor(first time.Time, earlier time.Time) time.Time {
	d := first.Add(p.Deadline)
	if !earlier.IsZero() && earlier.Before(d) {
		return earlier
	}
	return d
}

// CanAttempt reports whether enough time is left before deadline to start an
// attempt at now.
func (p *Policy) CanAttempt(now, deadline time.Time) bool {
	return deadline.Sub(now) >= p.MinAttempt
}

// Decide turns one answer into one action.
func (p *Policy) Decide(in Input) Decision {
	switch in.Outcome {
	case Success, Drop:
		return Decision{Action: Ack}
	case Unreachable:
		return Decision{Action: Hold}
	case Permanent:
		return deadLetter(ReasonPermanent)
	case Defer:
		if in.Now.Sub(in.FirstAttemptAt) >= p.DeferMaxAge {
			return deadLetter(ReasonDeferExpired)
		}
		return p.delay(in, in.Defers)
	case Retry, Overload, Unknown:
		failures := in.Attempt - in.Defers
		if failures >= p.MaxAttempts {
			return deadLetter(ReasonMaxAttempts)
		}
		return p.delay(in, failures-1)
	}
	// An outcome nobody classified is a defect in the caller; keep the
	// message rather than guess.
	return deadLetter(ReasonPermanent)
}

// delay schedules the next attempt after a backoff of exponent k, or
// dead-letters when that attempt could not start before the deadline.
func (p *Policy) delay(in Input, k int) Decision {
	d := p.Backoff(k)
	if in.RetryAfter > d {
		d = in.RetryAfter
	}
	tier := p.Tier(d)
	due := in.Now.Add(max(d, tier))
	if !p.CanAttempt(due, in.Deadline) {
		return deadLetter(ReasonDeadline)
	}
	return Decision{Action: Delay, Tier: tier, Due: due}
}

// Redelay schedules a copy that came back before its due time onto the tier
// that brings it back no earlier than due. It is not an attempt.
func (p *Policy) Redelay(now, due time.Time) Decision {
	tier := p.Tier(due.Sub(now))
	return Decision{Action: Delay, Tier: tier, Due: due}
}

// Backoff is the full-jitter delay before re-attempt k (0-based):
// random[0, min(Cap, Base·2^k)].
func (p *Policy) Backoff(k int) time.Duration {
	k = max(k, 0)
	ceiling := p.Cap
	if k < 63 && p.Base <= p.Cap>>k { // Base·2^k <= Cap, without overflowing
		ceiling = p.Base << k
	}
	return time.Duration(p.Jitter() * float64(ceiling))
}

// Tier is the smallest configured tier >= d, or the largest tier when d is
// longer than all of them.
func (p *Policy) Tier(d time.Duration) time.Duration {
	for _, t := range p.Tiers {
		if t >= d {
			return t
		}
	}
	return p.Tiers[len(p.Tiers)-1]
}

func deadLetter(r Reason) Decision { return Decision{Action: DeadLetter, Reason: r} }
