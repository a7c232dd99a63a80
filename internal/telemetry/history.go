package telemetry

import (
	"context"
	"sync"
	"time"
)

// Activity steps: the console charts each source's traffic from them,
// without Prometheus.
const (
	// ActivityStep is how long one step of the activity history counts.
	ActivityStep = 5 * time.Second
	// ActivitySpan is how far back the history goes.
	ActivitySpan = 15 * time.Minute
)

// Step is what one source's messages came to in one step of the history.
type Step struct {
	// At is when the step ended.
	At                                    time.Time
	Handled, Retried, DeadLettered, Other int64
}

// History keeps each source's Totals, differenced step by step, for the
// last span: a few KB a source. It is safe for concurrent use.
type History struct {
	metrics *Metrics
	sources []string
	step    time.Duration
	keep    int
	now     func() time.Time

	mu    sync.Mutex
	last  map[string]Totals
	steps map[string][]Step
}

// NewHistory keeps sources' activity from now on, one step every step, for
// span; now nil means time.Now.
func NewHistory(m *Metrics, sources []string, step, span time.Duration, now func() time.Time) *History {
	if now == nil {
		now = time.Now
	}
	h := &History{metrics: m, sources: sources, step: step, keep: max(int(span/step), 1), now: now,
		last: map[string]Totals{}, steps: map[string][]Step{}}
	for _, s := range sources {
		h.last[s] = m.Totals(s)
	}
	return h
}

// StepLength is the length of one step.
func (h *History) StepLength() time.Duration { return h.step }

// Sources names the sources kept, in the order given.
func (h *History) Sources() []string { return h.sources }

// Record ends a step: what each source's totals grew by since the last.
func (h *History) Record() {
	at := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.sources {
		now, was := h.metrics.Totals(s), h.last[s]
		h.last[s] = now
		steps := h.steps[s]
		if len(steps) == h.keep {
			steps = append(steps[:0], steps[1:]...)
		}
		h.steps[s] = append(steps, Step{At: at, Handled: now.Handled - was.Handled, Retried: now.Retried - was.Retried,
			DeadLettered: now.DeadLettered - was.DeadLettered, Other: now.Other - was.Other})
	}
}

// Snapshot returns a copy of every source's steps, in Sources order, read
// at once: each source's list ends at the same step.
func (h *History) Snapshot() [][]Step {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([][]Step, len(h.sources))
	for i, s := range h.sources {
		out[i] = append([]Step(nil), h.steps[s]...)
	}
	return out
}

// Run records a step every step until ctx ends.
func (h *History) Run(ctx context.Context) error {
	t := time.NewTicker(h.step)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			h.Record()
		}
	}
}
