package budget

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func policy(jitter float64) *Policy {
	return &Policy{
		MaxAttempts: 4,
		Base:        100 * time.Millisecond,
		Cap:         2 * time.Second,
		Tiers:       []time.Duration{time.Second, 10 * time.Second, time.Minute, 10 * time.Minute},
		Deadline:    time.Hour,
		DeferMaxAge: 24 * time.Hour,
		MinAttempt:  100 * time.Millisecond,
		Jitter:      func() float64 { return jitter },
	}
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name   string
		jitter float64
		in     Input
		want   Decision
	}{
		{"success acks", 0.5, Input{Outcome: Success, Attempt: 1}, Decision{Action: Ack}},
		{"drop acks", 0.5, Input{Outcome: Drop, Attempt: 3}, Decision{Action: Ack}},
		{"unreachable holds", 0.5, Input{Outcome: Unreachable, Attempt: 1}, Decision{Action: Hold}},
		{"permanent dead-letters at once", 0.5, Input{Outcome: Permanent, Attempt: 1}, Decision{Action: DeadLetter, Reason: ReasonPermanent}},
		{
			"first retry uses the smallest tier", 0.99,
			Input{Outcome: Retry, Attempt: 1, Now: t0, FirstAttemptAt: t0, Deadline: t0.Add(time.Hour)},
			Decision{Action: Delay, Tier: time.Second, Due: t0.Add(time.Second)},
		},
		{
			"zero jitter still waits the smallest tier", 0,
			Input{Outcome: Overload, Attempt: 1, Now: t0, FirstAttemptAt: t0, Deadline: t0.Add(time.Hour)},
			Decision{Action: Delay, Tier: time.Second, Due: t0.Add(time.Second)},
		},
		{
			"retry-after wins when larger", 0.5,
			Input{Outcome: Overload, Attempt: 1, RetryAfter: 5 * time.Second, Now: t0, FirstAttemptAt: t0, Deadline: t0.Add(time.Hour)},
			Decision{Action: Delay, Tier: 10 * time.Second, Due: t0.Add(10 * time.Second)},
		},
		{
			"retry-after beyond the largest tier comes back due later", 0.5,
			Input{Outcome: Retry, Attempt: 1, RetryAfter: 20 * time.Minute, Now: t0, FirstAttemptAt: t0, Deadline: t0.Add(time.Hour)},
			Decision{Action: Delay, Tier: 10 * time.Minute, Due: t0.Add(20 * time.Minute)},
		},
		{
			"last allowed attempt exhausts", 0.5,
			Input{Outcome: Retry, Attempt: 4, Now: t0, FirstAttemptAt: t0, Deadline: t0.Add(time.Hour)},
			Decision{Action: DeadLetter, Reason: ReasonMaxAttempts},
		},
		{
			"unknown counts as a failure", 0.5,
			Input{Outcome: Unknown, Attempt: 4, Now: t0, FirstAttemptAt: t0, Deadline: t0.Add(time.Hour)},
			Decision{Action: DeadLetter, Reason: ReasonMaxAttempts},
		},
		{
			"defers do not count against max attempts", 0.5,
			Input{Outcome: Retry, Attempt: 4, Defers: 2, Now: t0, FirstAttemptAt: t0, Deadline: t0.Add(time.Hour)},
			Decision{Action: Delay, Tier: time.Second, Due: t0.Add(time.Second)},
		},
		{
			"next attempt would start after the deadline", 0.5,
			Input{Outcome: Retry, Attempt: 1, Now: t0, FirstAttemptAt: t0.Add(-time.Hour), Deadline: t0.Add(500 * time.Millisecond)},
			Decision{Action: DeadLetter, Reason: ReasonDeadline},
		},
		{
			"next attempt fits just before the deadline", 0.5,
			Input{Outcome: Retry, Attempt: 1, Now: t0, FirstAttemptAt: t0, Deadline: t0.Add(1100 * time.Millisecond)},
			Decision{Action: Delay, Tier: time.Second, Due: t0.Add(time.Second)},
		},
		{
			"defer retries within its max age", 0.5,
			Input{Outcome: Defer, Attempt: 9, Defers: 8, Now: t0, FirstAttemptAt: t0.Add(-time.Hour), Deadline: t0.Add(time.Hour)},
			Decision{Action: Delay, Tier: time.Second, Due: t0.Add(time.Second)},
		},
		{
			"defer expires", 0.5,
			Input{Outcome: Defer, Attempt: 2, Defers: 1, Now: t0, FirstAttemptAt: t0.Add(-24 * time.Hour), Deadline: t0.Add(time.Hour)},
			Decision{Action: DeadLetter, Reason: ReasonDeferExpired},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := policy(tt.jitter).Decide(tt.in)
			if got != tt.want {
				t.Errorf("Decide = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestBackoffFullJitter(t *testing.T) {
	p := policy(0.999999)
	for k, want := range []time.Duration{100, 200, 400, 800, 1600, 2000, 2000} {
		want *= time.Millisecond
		got := p.Backoff(k)
		if got > want || got < want*99/100 {
			t.Errorf("Backoff(%d) with jitter≈1 = %v, want just under %v", k, got, want)
		}
	}
	if got := p.Backoff(200); got > p.Cap {
		t.Errorf("Backoff(200) = %v overflows past the cap", got)
	}
	if got := policy(0).Backoff(3); got != 0 {
		t.Errorf("Backoff with jitter 0 = %v, want 0", got)
	}
}

func TestTierAndRedelay(t *testing.T) {
	p := policy(0)
	for _, c := range []struct{ d, want time.Duration }{
		{0, time.Second}, {time.Second, time.Second}, {1001 * time.Millisecond, 10 * time.Second},
		{time.Hour, 10 * time.Minute},
	} {
		if got := p.Tier(c.d); got != c.want {
			t.Errorf("Tier(%v) = %v, want %v", c.d, got, c.want)
		}
	}
	due := t0.Add(15 * time.Minute)
	got := p.Redelay(t0.Add(10*time.Minute), due)
	if got.Action != Delay || got.Tier != 10*time.Minute || !got.Due.Equal(due) {
		t.Errorf("Redelay = %+v", got)
	}
}

func TestDeadlineFor(t *testing.T) {
	p := policy(0)
	if got := p.DeadlineFor(t0, time.Time{}); !got.Equal(t0.Add(time.Hour)) {
		t.Errorf("DeadlineFor = %v", got)
	}
	earlier := t0.Add(time.Minute)
	if got := p.DeadlineFor(t0, earlier); !got.Equal(earlier) {
		t.Errorf("an earlier limit must win: %v", got)
	}
	if got := p.DeadlineFor(t0, t0.Add(2*time.Hour)); !got.Equal(t0.Add(time.Hour)) {
		t.Errorf("a later limit must not extend the deadline: %v", got)
	}
	if p.CanAttempt(t0, t0.Add(50*time.Millisecond)) || !p.CanAttempt(t0, t0.Add(100*time.Millisecond)) {
		t.Error("CanAttempt must require MinAttempt left")
	}
}

func TestParseOutcome(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Outcome
		ok   bool
	}{
		{"success", Success, true}, {"retry", Retry, true}, {"defer", Defer, true},
		{"dead-letter", Permanent, true}, {"permanent", Permanent, true}, {"drop", Drop, true},
		{"overload", Overload, true}, {"unknown", Unknown, true},
		{"unreachable", 0, false}, {"", 0, false}, {"SUCCESS", 0, false}, {"outcome(0)", 0, false},
	} {
		got, ok := ParseOutcome(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseOutcome(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}
