package telemetry

import (
	"testing"
	"time"
)

// Each step holds what the totals grew by in it, per source and kind; the
// history keeps the last span's steps, oldest first, and counts with
// metrics off too (the console needs no exporter).
func TestHistorySteps(t *testing.T) {
	m, err := NewMetrics(MetricsOptions{Off: true})
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m.Attempted("orders", "success", true, time.Millisecond) // before: not counted
	h := NewHistory(m, []string{"orders", "payments"}, 5*time.Second, 15*time.Second, func() time.Time { return clock })
	for range 3 {
		m.Attempted("orders", "success", true, time.Millisecond)
	}
	m.Attempted("orders", "retry", true, time.Millisecond) // an answer, not a settlement
	m.Retried("orders", "5s")
	m.DeadLettered("orders", "permanent")
	m.Attempted("orders", "drop", true, time.Millisecond)
	m.Duplicate("orders")
	m.Attempted("payments", "success", true, time.Millisecond)
	clock = clock.Add(5 * time.Second)
	h.Record()
	got := h.Snapshot()[0]
	want := Step{At: clock, Handled: 3, Retried: 1, DeadLettered: 1, Other: 2}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("orders %+v, want [%+v]", got, want)
	}
	if p := h.Snapshot()[1]; len(p) != 1 || p[0].Handled != 1 {
		t.Fatalf("payments %+v", p)
	}
	for range 4 {
		clock = clock.Add(5 * time.Second)
		m.Attempted("orders", "success", true, time.Millisecond)
		h.Record()
	}
	got = h.Snapshot()[0]
	if len(got) != 3 || !got[0].At.Equal(clock.Add(-10*time.Second)) || got[2].Handled != 1 || got[2].Retried != 0 {
		t.Fatalf("after five steps of a 15 s span: %+v", got)
	}
	if n := len(h.Snapshot()); n != 2 {
		t.Fatalf("%d sources' steps, want the 2 kept", n)
	}
}
