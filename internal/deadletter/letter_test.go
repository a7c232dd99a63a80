package deadletter

import (
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// A dead letter was made when its handoff-dead-lettered-at header says,
// when that is readable; else when its log says.
func TestFillPrefersTheDeadLetteredAtHeader(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	made := time.Date(2026, 12, 1, 9, 59, 58, 250e6, time.UTC)
	tests := []struct {
		name   string
		header string // "" leaves it out
		want   time.Time
	}{
		{"header", made.Format(broker.TimeLayout), made},
		{"header in another zone", made.In(time.FixedZone("x", 3600)).Format(time.RFC3339Nano), made},
		{"no header", "", at},
		{"unreadable header", "yesterday", at},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &broker.Message{Headers: broker.Headers{broker.HeaderEventID: "e-1"}}
			if tt.header != "" {
				m.Headers[broker.HeaderDeadLetteredAt] = tt.header
			}
			var l Letter
			l.fill(at.In(time.FixedZone("y", -7200)), m)
			if !l.DeadLetteredAt.Equal(tt.want) || l.DeadLetteredAt.Location() != time.UTC {
				t.Errorf("DeadLetteredAt = %v, want %v in UTC", l.DeadLetteredAt, tt.want)
			}
		})
	}
}

// Every time in a dead letter's headers is read as the trail reads it: a
// first failure written without milliseconds (by an older writer, or a
// copy made by hand) is still the dead letter's first failure.
func TestFillReadsTimesAsTheTrailDoes(t *testing.T) {
	first := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for _, v := range []string{first.Format(broker.TimeLayout), first.Format(time.RFC3339), "2026-12-01T09:00:00.000000Z"} {
		m := &broker.Message{Headers: broker.Headers{broker.HeaderEventID: "e-1", broker.HeaderFirstFailureAt: v}}
		var l Letter
		l.fill(first, m)
		if !l.FirstFailureAt.Equal(first) {
			t.Errorf("first failure %q read as %v, want %v", v, l.FirstFailureAt, first)
		}
	}
}
