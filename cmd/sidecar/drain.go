package main

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"handoff.dev/handoff/internal/redact"
	"handoff.dev/handoff/internal/telemetry"
)

// drainReadings is how many times a source's backlog is read in the drain
// window (telemetry.drain_window): every 5 s in the default minute.
const drainReadings = 12

// minBacklogRead is the least time a backlog read is given. A reading's
// time is its interval, but with a short drain window on a busy broker
// every read of a tenth of a second timed out and no estimate was ever
// made; a slow read only delays the next reading.
const minBacklogRead = 2 * time.Second

// drains reads every source's backlog at intervals and estimates its
// arrival and completion rates and its drain time (seed 000: B/(μ−λ)).
type drains struct {
	sources []source
	metrics *telemetry.Metrics
	log     *slog.Logger
	est     map[string]*telemetry.Drain
	every   time.Duration
}

// newDrains estimates each source's rates over window, reading its backlog
// drainReadings times in it.
func newDrains(sources []source, m *telemetry.Metrics, window time.Duration, log *slog.Logger) *drains {
	d := &drains{sources: sources, metrics: m, log: log, est: map[string]*telemetry.Drain{}, every: window / drainReadings}
	for _, s := range sources {
		d.est[s.name] = telemetry.NewDrain(window)
	}
	return d
}

// run reads the backlogs until ctx ends.
func (d *drains) run(ctx context.Context) error {
	t := time.NewTicker(d.every)
	defer t.Stop()
	for {
		d.read(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (d *drains) read(ctx context.Context) {
	for _, s := range d.sources {
		if s.backlog == nil {
			continue
		}
		// Dated when asked, not when answered: on a busy broker the answer
		// can take a while, and the rates are over the readings' dates.
		at := time.Now()
		taken := d.metrics.Taken(s.name)
		rctx, cancel := context.WithTimeout(ctx, max(d.every, minBacklogRead))
		b, produced, known, err := s.backlog(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				d.log.Debug("backlog unknown", "source", s.name, "err", redact.Error(err))
			}
			continue
		}
		if known {
			// The group's consumption, all replicas together, as its
			// committed offsets say: this replica's own count would make μ
			// one replica's share of a group-wide backlog.
			taken = produced - b
		}
		d.est[s.name].Add(telemetry.DrainSample{At: at, Backlog: b, Taken: taken,
			Produced: produced, ProducedKnown: known})
	}
}

// observe registers the backlog's gauges: B, λ, μ and the drain time
// (+Inf when μ ≤ λ: not converging).
func (d *drains) observe(m *telemetry.Metrics) error {
	gauge := func(name, unit, desc string, pick func(telemetry.Estimate) float64) error {
		return m.Observe(name, unit, desc, func() []telemetry.Gauge {
			var out []telemetry.Gauge
			for _, s := range d.sources {
				if e, ok := d.est[s.name].Estimate(); ok {
					out = append(out, telemetry.Gauge{Value: pick(e), Attrs: []attribute.KeyValue{attribute.String("source", s.name)}})
				}
			}
			return out
		})
	}
	for _, g := range []struct {
		name, unit, desc string
		pick             func(telemetry.Estimate) float64
	}{
		{"handoff.backlog.messages", "", "Messages waiting in the source: the Kafka group's lag, the RabbitMQ queue's ready count.",
			func(e telemetry.Estimate) float64 { return e.Backlog }},
		{"handoff.arrival.rate", "", "Messages produced to the source a second (λ), over telemetry.drain_window.",
			func(e telemetry.Estimate) float64 { return e.Arrival }},
		{"handoff.completion.rate", "", "Messages the sidecar took from the source a second (μ), over telemetry.drain_window.",
			func(e telemetry.Estimate) float64 { return e.Completion }},
		{"handoff.backlog.drain", "s", "How long the backlog takes to drain at these rates, B/(μ−λ); +Inf when μ ≤ λ (not converging).",
			func(e telemetry.Estimate) float64 { return e.Drain }},
	} {
		if err := gauge(g.name, g.unit, g.desc, g.pick); err != nil {
			return err
		}
	}
	return nil
}
