package sidecar

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/telemetry"
)

// The summary says what changed since its last line, per source, and
// nothing for a source where nothing flows.
func TestSummarySaysWhatFlowed(t *testing.T) {
	m, err := telemetry.NewMetrics(telemetry.MetricsOptions{Off: true})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	inFlight := 0
	s := summary{metrics: m, sources: []string{"orders", "idle"}, every: 30 * time.Second,
		log: slog.New(slog.NewTextHandler(&b, nil)),
		status: func() dispatch.Status {
			return dispatch.Status{Routes: []dispatch.RouteStatus{{Name: "orders", InFlight: inFlight}}}
		}}
	last := map[string]telemetry.Totals{}
	for range 5 {
		m.Received("orders", false)
	}
	for range 3 {
		m.Attempted("orders", "success", true, time.Millisecond)
	}
	m.Attempted("orders", "retry", true, time.Millisecond)
	m.Retried("orders", "1s")
	m.DeadLettered("orders", "permanent")
	inFlight = 1
	s.line(last)
	got := b.String()
	for _, want := range []string{"source=orders", "taken=5", "handled=3", "retried=1", "dead_lettered=1", "in_flight=1"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %s: %s", want, got)
		}
	}
	if strings.Contains(got, "idle") {
		t.Errorf("a line for a source where nothing flows: %s", got)
	}
	b.Reset()
	inFlight = 0
	s.line(last)
	if b.Len() != 0 {
		t.Errorf("a line when nothing changed: %s", b.String())
	}
}
