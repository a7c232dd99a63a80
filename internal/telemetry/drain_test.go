package telemetry

import (
	"math"
	"testing"
	"time"
)

// Seed 000's table: a backlog of 1.2 M with 8,000 arrivals a second.
func TestDrainTimeSeedTable(t *testing.T) {
	for _, tt := range []struct {
		mu, want float64
	}{
		{10000, 600},
		{7000, math.Inf(1)},
		{9000, 1200},
		{8000, math.Inf(1)}, // μ = λ: the backlog stays
	} {
		if got := DrainTime(1.2e6, 8000, tt.mu); got != tt.want {
			t.Errorf("B=1.2M λ=8000 μ=%v: %v s, want %v", tt.mu, got, tt.want)
		}
	}
	if got := DrainTime(0, 8000, 7000); got != 0 {
		t.Errorf("no backlog: %v, want 0", got)
	}
}

// The estimator takes μ from what was taken, and λ from the log's end where
// the broker says, else from μ and the backlog's change.
func TestDrainEstimate(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	d := NewDrain(time.Minute)
	if _, ok := d.Estimate(); ok {
		t.Fatal("an estimate from nothing")
	}
	// RabbitMQ-like: 10 s apart, 1,000 taken and the backlog down by 600:
	// λ = 100 - 60 = 40/s, μ = 100/s, B = 2,400 → 40 s.
	d.Add(DrainSample{At: t0, Backlog: 3000, Taken: 0})
	d.Add(DrainSample{At: t0.Add(10 * time.Second), Backlog: 2400, Taken: 1000})
	e, ok := d.Estimate()
	if !ok || e.Completion != 100 || e.Arrival != 40 || e.Drain != 40 {
		t.Fatalf("estimate %+v", e)
	}
	// Kafka-like: the produced count says λ; faster than μ: never drains.
	k := NewDrain(time.Minute)
	k.Add(DrainSample{At: t0, Backlog: 100, Taken: 0, Produced: 0, ProducedKnown: true})
	k.Add(DrainSample{At: t0.Add(20 * time.Second), Backlog: 300, Taken: 400, Produced: 600, ProducedKnown: true})
	if e, _ := k.Estimate(); e.Arrival != 30 || e.Completion != 20 || !math.IsInf(e.Drain, 1) {
		t.Fatalf("estimate %+v", e)
	}
	// Readings older than the window go, but one before it stays as its start.
	for i := 1; i <= 12; i++ {
		k.Add(DrainSample{At: t0.Add(time.Duration(20+10*i) * time.Second), Backlog: 300, Taken: 400 + 100*int64(i), Produced: 600 + 50*int64(i), ProducedKnown: true})
	}
	if e, _ := k.Estimate(); e.Completion != 10 || e.Arrival != 5 || e.Drain != 60 {
		t.Fatalf("estimate over the last minute %+v", e)
	}
}
