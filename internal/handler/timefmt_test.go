package handler

import (
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
)

func TestAppendTime(t *testing.T) {
	east := time.FixedZone("UTC+5:30", 5*3600+1800)
	tests := []struct {
		name string
		t    time.Time
	}{
		{"epoch", time.Unix(0, 0)},
		{"a deadline", time.Date(2026, 12, 3, 11, 43, 54, 123456789, time.UTC)},
		{"last nanosecond of a millisecond", time.Date(2026, 1, 2, 3, 4, 5, 999999999, time.UTC)},
		{"another zone", time.Date(2026, 1, 1, 2, 0, 0, 5e6, east)},
		{"year one", time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"year zero", time.Date(0, 6, 1, 0, 0, 0, 0, time.UTC)},
		{"year 9999", time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC)},
		{"year 10000", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"before year zero", time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"with a monotonic reading", time.Now()},
		{"zero", time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.t.UTC().Format(broker.TimeLayout)
			if got := string(appendTime([]byte("x"), tt.t)); got != "x"+want {
				t.Errorf("appendTime = %q, want %q", got, "x"+want)
			}
		})
	}
}

func FuzzAppendTime(f *testing.F) {
	f.Add(int64(0), int64(0))
	f.Add(int64(1796299434), int64(999999999))
	f.Add(int64(-62135596800), int64(1))
	f.Add(int64(253402300800), int64(0))
	f.Fuzz(func(t *testing.T, sec, nsec int64) {
		tm := time.Unix(sec, nsec)
		if got, want := string(appendTime(nil, tm)), tm.UTC().Format(broker.TimeLayout); got != want {
			t.Errorf("appendTime(%d, %d) = %q, want %q", sec, nsec, got, want)
		}
	})
}

func BenchmarkAppendTime(b *testing.B) {
	tm := time.Date(2026, 12, 3, 11, 43, 54, 123456789, time.UTC)
	var buf [40]byte
	b.Run("appendTime", func(b *testing.B) {
		for b.Loop() {
			_ = appendTime(buf[:0], tm)
		}
	})
	b.Run("AppendFormat", func(b *testing.B) {
		for b.Loop() {
			_ = tm.UTC().AppendFormat(buf[:0], broker.TimeLayout)
		}
	})
}
