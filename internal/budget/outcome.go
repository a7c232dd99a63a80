package budget

import "fmt"

// Outcome is the class of one answer from the app. The handler's classifier
// produces it (internal/handler); Decide turns it into an action. It is the
// one place where "is this retryable" is answered.
type Outcome uint8

const (
	// Success: the app handled the input (a business rejection it recorded is
	// also a success). Action: ack.
	Success Outcome = iota + 1
	// Retry: a transient failure (downstream briefly away, recoverable
	// conflict). Action: delayed retry with backoff.
	Retry
	// Overload: the app asks to slow down (429/503). Action: delayed retry
	// honouring Retry-After.
	Overload
	// Unknown: the call timed out or broke mid-way; the effect may have
	// happened. Action: retry with the same event id, flagged redelivered.
	Unknown
	// Defer: a precondition has not arrived yet (409). Action: delayed retry
	// bounded by retry.defer_max_age; not counted as a failed attempt.
	Defer
	// Permanent: bad input or a program defect (400/404/415/422). Action:
	// dead-letter at once.
	Permanent
	// Drop: the app asks to discard the message (410). Action: ack.
	Drop
	// Unreachable: the app did not take the call at all (connection refused).
	// Action: hold — pause intake, probe, and call again without burning an
	// attempt.
	Unreachable
)

var outcomeNames = [...]string{
	Success:     "success",
	Retry:       "retry",
	Overload:    "overload",
	Unknown:     "unknown",
	Defer:       "defer",
	Permanent:   "permanent",
	Drop:        "drop",
	Unreachable: "unreachable",
}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// IsFailure reports whether o counts against retry.max_attempts.
func (o Outcome) IsFailure() bool { return o == Retry || o == Overload || o == Unknown }

// ParseOutcome maps a name used in config (outcomes.http values) or in the
// app's Handoff-Outcome response header to an Outcome. "dead-letter" is the
// header's spelling of Permanent.
func ParseOutcome(s string) (Outcome, bool) {
	switch s {
	case "dead-letter":
		return Permanent, true
	case "unreachable", "":
		// Unreachable is what the transport observed; nobody may declare it.
		return 0, false
	}
	for i, name := range outcomeNames {
		if name == s {
			return Outcome(i), true
		}
	}
	return 0, false
}
