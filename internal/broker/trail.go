package broker

import (
	"fmt"
	"strconv"
	"time"
)

const headerPrefix = "handoff-"

// The handoff-* headers a copy carries across hops (DESIGN §3).
const (
	HeaderEventID        = "handoff-event-id"
	HeaderAttempt        = "handoff-attempt"
	HeaderHops           = "handoff-hops"
	HeaderDefers         = "handoff-defers"
	HeaderFirstAttemptAt = "handoff-first-attempt-at"
	HeaderFirstFailureAt = "handoff-first-failure-at"
	HeaderNextDue        = "handoff-next-due"
	HeaderDeadline       = "handoff-deadline"
	HeaderErrorClass     = "handoff-error-class"
	HeaderError          = "handoff-error"
	HeaderOrigin         = "handoff-origin"
	HeaderDeadReason     = "handoff-dead-reason"
	HeaderReplayID       = "handoff-replay-id"
	// HeaderReplayOf names the dead letter (its id, Q.dlq/<offset> or
	// T.G.dlq/<partition>/<offset>) that a replayed copy replays.
	HeaderReplayOf = "handoff-replay-of"
	// HeaderDeadLetteredAt is when a dead-letter copy was made: a RabbitMQ
	// stream tells an AMQP 0.9.1 reader no time of its own.
	HeaderDeadLetteredAt = "handoff-dead-lettered-at"
	// HeaderStops counts the attempts the sidecar stopped during (the
	// process gone mid-call), and HeaderAloneStops those of them made alone,
	// with no other call in flight: the evidence that a message kills its
	// consumer.
	HeaderStops      = "handoff-stops"
	HeaderAloneStops = "handoff-alone-stops"
	// HeaderRedelivered says an earlier attempt may have done the work
	// without the sidecar learning of it: every later attempt says so too
	// (Handoff-Redelivered).
	HeaderRedelivered = "handoff-redelivered"
)

// TimeLayout is how times are written in handoff-* headers: RFC 3339 in UTC
// with milliseconds, readable by people and by every language.
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// MaxErrorLen bounds the handoff-error header.
const MaxErrorLen = 512

// Trail is a message's history so far, carried in handoff-* headers from hop
// to hop so that moving between queues never resets its age or attempts.
type Trail struct {
	EventID string
	// Attempt is the number of attempts made so far (the one that just
	// failed, on a copy).
	Attempt int
	// Hops counts the copies made so far: 0 on the original message, n on
	// the n-th copy. With the event id it names one delivery of a hand-off.
	Hops int
	// Defers counts attempts answered with Defer; they do not count against
	// max attempts.
	Defers         int
	FirstAttemptAt time.Time
	FirstFailureAt time.Time
	NextDue        time.Time
	Deadline       time.Time
	ErrorClass     string
	Error          string
	Origin         string
	DeadReason     string
	ReplayID       string
	// ReplayOf is the dead letter a replayed copy replays.
	ReplayOf string
	// DeadLetteredAt is set on a dead-letter copy: when it was made.
	DeadLetteredAt time.Time
	// Stops counts the attempts the sidecar stopped during, the process
	// gone mid-call; AloneStops those of them made alone. A message with
	// stops is called alone from then on: a crash during such a call is
	// its own doing.
	Stops      int
	AloneStops int
	// Redelivered: an earlier attempt may have done the work, its answer
	// lost (the process gone mid-call, a timeout) or its delivery come back
	// from the broker. It stays set: every later attempt says
	// Handoff-Redelivered, whatever the attempts between them answered.
	Redelivered bool
}

// Headers returns t as handoff-* headers. The event id and attempt are always
// written; other zero fields are left out.
func (t *Trail) Headers() Headers {
	h := Headers{
		HeaderEventID: t.EventID,
		HeaderAttempt: strconv.Itoa(t.Attempt),
	}
	set := func(k, v string) {
		if v != "" {
			h[k] = v
		}
	}
	setTime := func(k string, v time.Time) {
		if !v.IsZero() {
			h[k] = v.UTC().Format(TimeLayout)
		}
	}
	if t.Hops > 0 {
		h[HeaderHops] = strconv.Itoa(t.Hops)
	}
	if t.Defers > 0 {
		h[HeaderDefers] = strconv.Itoa(t.Defers)
	}
	if t.Stops > 0 {
		h[HeaderStops] = strconv.Itoa(t.Stops)
	}
	if t.AloneStops > 0 {
		h[HeaderAloneStops] = strconv.Itoa(t.AloneStops)
	}
	if t.Redelivered {
		h[HeaderRedelivered] = "true"
	}
	setTime(HeaderFirstAttemptAt, t.FirstAttemptAt)
	setTime(HeaderFirstFailureAt, t.FirstFailureAt)
	setTime(HeaderNextDue, t.NextDue)
	setTime(HeaderDeadline, t.Deadline)
	set(HeaderErrorClass, t.ErrorClass)
	set(HeaderError, truncate(t.Error, MaxErrorLen))
	set(HeaderOrigin, t.Origin)
	set(HeaderDeadReason, t.DeadReason)
	set(HeaderReplayID, t.ReplayID)
	set(HeaderReplayOf, t.ReplayOf)
	setTime(HeaderDeadLetteredAt, t.DeadLetteredAt)
	return h
}

// ParseTrail reads the trail of a copy the sidecar wrote. It fails when a
// header the sidecar always writes is missing or unreadable: such a copy is
// dead-lettered as malformed, never guessed at.
func ParseTrail(h Headers) (Trail, error) {
	var t Trail
	var err error
	t.EventID = h[HeaderEventID]
	if t.EventID == "" {
		return t, fmt.Errorf("%s missing", HeaderEventID)
	}
	if t.Attempt, err = atoi(h, HeaderAttempt, true); err != nil {
		return t, err
	}
	if t.Hops, err = atoi(h, HeaderHops, false); err != nil {
		return t, err
	}
	if t.Defers, err = atoi(h, HeaderDefers, false); err != nil {
		return t, err
	}
	if t.Defers > t.Attempt {
		return t, fmt.Errorf("%s %d exceeds %s %d", HeaderDefers, t.Defers, HeaderAttempt, t.Attempt)
	}
	if t.Stops, err = atoi(h, HeaderStops, false); err != nil {
		return t, err
	}
	if t.AloneStops, err = atoi(h, HeaderAloneStops, false); err != nil {
		return t, err
	}
	if t.AloneStops > t.Stops {
		return t, fmt.Errorf("%s %d exceeds %s %d", HeaderAloneStops, t.AloneStops, HeaderStops, t.Stops)
	}
	switch v, ok := h[HeaderRedelivered]; {
	case !ok:
	case v == "true":
		t.Redelivered = true
	default:
		return t, fmt.Errorf("%s %q: want true or none", HeaderRedelivered, v)
	}
	for _, f := range []struct {
		key      string
		dst      *time.Time
		required bool
	}{
		{HeaderFirstAttemptAt, &t.FirstAttemptAt, true},
		{HeaderFirstFailureAt, &t.FirstFailureAt, false},
		{HeaderNextDue, &t.NextDue, false},
		{HeaderDeadline, &t.Deadline, true},
	} {
		v, ok := h[f.key]
		if !ok {
			if f.required {
				return t, fmt.Errorf("%s missing", f.key)
			}
			continue
		}
		ts, err := ParseTime(f.key, v)
		if err != nil {
			return t, err
		}
		*f.dst = ts
	}
	t.ErrorClass = h[HeaderErrorClass]
	t.Error = h[HeaderError]
	t.Origin = h[HeaderOrigin]
	t.DeadReason = h[HeaderDeadReason]
	t.ReplayID = h[HeaderReplayID]
	t.ReplayOf = h[HeaderReplayOf]
	if v, ok := h[HeaderDeadLetteredAt]; ok {
		if t.DeadLetteredAt, err = ParseTime(HeaderDeadLetteredAt, v); err != nil {
			return t, err
		}
	}
	return t, nil
}

// ParseTime reads the time in header key: RFC 3339 with any fraction of a
// second, or none (TimeLayout writes milliseconds; a producer's
// handoff-deadline may carry more). Times are written back in UTC: one whose
// UTC year leaves four digits could not be read again at the next hop.
func ParseTime(key, v string) (time.Time, error) {
	ts, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || ts.UTC().Year() < 0 || ts.UTC().Year() > 9999 {
		return time.Time{}, fmt.Errorf("%s: %q is not an RFC 3339 time", key, v)
	}
	return ts, nil
}

func atoi(h Headers, key string, required bool) (int, error) {
	v, ok := h[key]
	if !ok {
		if required {
			return 0, fmt.Errorf("%s missing", key)
		}
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s: %q is not a count", key, v)
	}
	return n, nil
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && s[i]&0xC0 == 0x80 {
		i--
	}
	return s[:i]
}

// CopyIdentity is what tells one copy from another at a destination: its
// event id, replay id and hop. A trail without an event id or a hop names no
// copy; looking one up by it would match any message without handoff-*
// headers and settle the source with no copy anywhere, so it is an error.
func CopyIdentity(trail Headers) ([3]string, error) {
	id := [3]string{trail[HeaderEventID], trail[HeaderReplayID], trail[HeaderHops]}
	if id[0] == "" || id[2] == "" {
		return id, fmt.Errorf("the recorded copy has no %s or %s to look it up by", HeaderEventID, HeaderHops)
	}
	return id, nil
}
