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

// Messages received and attempts' outcomes are counters by source (and
// outcome and attempt), counting fresh messages and retry copies alike.
func TestMetricsReceivedAndOutcomes(t *testing.T) {
	m, err := NewMetrics(MetricsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m.Received("orders", false)
		m.Attempted("orders", "retry", true, time.Millisecond)
	}
	m.Received("orders", true)
	m.Attempted("orders", "success", false, time.Millisecond)
	m.Received("payments", false)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		"# TYPE handoff_messages_received_total counter\n",
		`handoff_messages_received_total{source="orders"} 4` + "\n",
		`handoff_messages_received_total{source="payments"} 1` + "\n",
		"# TYPE handoff_outcomes_total counter\n",
		`handoff_outcomes_total{attempt="first",outcome="retry",source="orders"} 3` + "\n",
		`handoff_outcomes_total{attempt="again",outcome="success",source="orders"} 1` + "\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("want %q in:\n%s", want, body)
		}
	}
	if m.Taken("orders") != 3 {
		t.Errorf("taken %d, want 3 (the fresh messages)", m.Taken("orders"))
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
	m.Evicted(3)
	if m.Taken("orders") != 1 {
		t.Fatalf("taken %d, want 1 (the fresh message)", m.Taken("orders"))
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if body := rec.Body.String(); strings.Contains(body, "handoff_outcomes_total") || strings.Contains(body, "handoff_messages_received_total") ||
		strings.Contains(body, "handoff_journal_evicted_total 3") {
		t.Fatalf("measured while off:\n%s", rec.Body.String())
	}
}

// The journal's evictions are a counter exported from the start, at zero,
// so that an alert on its increase has a series to read.
func TestMetricsJournalEvicted(t *testing.T) {
	m, err := NewMetrics(MetricsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	if body := scrape(); !strings.Contains(body, "\nhandoff_journal_evicted_total 0\n") {
		t.Fatalf("before any eviction, want handoff_journal_evicted_total 0 in:\n%s", body)
	}
	m.Evicted(512)
	m.Evicted(88)
	if body := scrape(); !strings.Contains(body, "\nhandoff_journal_evicted_total 600\n") {
		t.Fatalf("after 512 and 88 evicted, want handoff_journal_evicted_total 600 in:\n%s", body)
	}
}

// BenchmarkMetricsPerMessage is what the metrics add to one message handled
// on its first attempt: it is taken, and its attempt counted and timed. Set
// beside the sidecar's CPU per message in BENCH.md, it is the metrics' share
// of the hot path.
func BenchmarkMetricsPerMessage(b *testing.B) {
	for _, off := range []bool{false, true} {
		name := "on"
		if off {
			name = "off"
		}
		b.Run(name, func(b *testing.B) {
			m, err := NewMetrics(MetricsOptions{Off: off})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				m.Received("orders", false)
				m.Attempted("orders", "success", true, time.Millisecond)
			}
		})
	}
}
