package telemetry

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The calls made for every message allocate nothing once a series was
// seen: they run on the hand-off's hot path.
func TestMetricsHotPathAllocatesNothing(t *testing.T) {
	m, err := NewMetrics(MetricsOptions{})
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

// Off, the metrics measure nothing but the completions the drain estimate
// needs.
func TestMetricsOffCountOnlyWhatTheDrainNeeds(t *testing.T) {
	m, err := NewMetrics(MetricsOptions{Off: true})
	if err != nil {
		t.Fatal(err)
	}
	m.Received("orders", false)
	m.Received("orders", true)
	m.Attempted("orders", "success", true, time.Millisecond)
	m.Committed(time.Millisecond)
	if m.Taken("orders") != 1 {
		t.Fatalf("taken %d, want 1 (the fresh message)", m.Taken("orders"))
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if strings.Contains(rec.Body.String(), "handoff_outcomes_total") || strings.Contains(rec.Body.String(), "handoff_messages_received_total") {
		t.Fatalf("measured while off:\n%s", rec.Body.String())
	}
}
