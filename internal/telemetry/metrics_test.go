package telemetry

import (
	"testing"
	"time"
)

// The calls made for every message allocate nothing once a series was
// seen: they run on the hand-off's hot path.
func TestMetricsHotPathAllocatesNothing(t *testing.T) {
	m, err := NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	m.Received("orders", false)
	m.Attempted("orders", "success", true, time.Millisecond)
	if n := testing.AllocsPerRun(1000, func() {
		m.Received("orders", false)
		m.Attempted("orders", "success", true, time.Millisecond)
	}); n != 0 {
		t.Fatalf("%v allocations per message", n)
	}
	if m.Taken("orders") < 1000 {
		t.Fatalf("taken %d", m.Taken("orders"))
	}
}
