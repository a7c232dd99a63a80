package sidecar

import (
	"context"
	"log/slog"
	"time"

	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/telemetry"
)

// summaryEvery is how often the log sums up each source's traffic.
const summaryEvery = 30 * time.Second

// summary logs, every summaryEvery while messages flow, one line a source:
// what it took, how many the app handled, retried and dead-lettered since
// the last line, and what is in flight. At the default level a run is
// otherwise silent about its messages.
type summary struct {
	metrics *telemetry.Metrics
	status  func() dispatch.Status
	sources []string
	log     *slog.Logger
	every   time.Duration
}

func (s summary) run(ctx context.Context) error {
	t := time.NewTicker(s.every)
	defer t.Stop()
	last := map[string]telemetry.Totals{}
	for _, name := range s.sources {
		last[name] = s.metrics.Totals(name)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s.line(last)
	}
}

// line logs what changed since last, and keeps the totals in it.
func (s summary) line(last map[string]telemetry.Totals) {
	inFlight := map[string]int{}
	for _, r := range s.status().Routes {
		inFlight[r.Name] = r.InFlight
	}
	for _, name := range s.sources {
		now, was := s.metrics.Totals(name), last[name]
		last[name] = now
		if now == was && inFlight[name] == 0 {
			continue // nothing flows
		}
		s.log.Info("messages", "source", name, "over", s.every,
			"taken", now.Taken-was.Taken, "handled", now.Handled-was.Handled,
			"retried", now.Retried-was.Retried, "dead_lettered", now.DeadLettered-was.DeadLettered,
			"in_flight", inFlight[name])
	}
}
