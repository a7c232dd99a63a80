package sidecar

import (
	"errors"
	"runtime"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"handoff.dev/handoff/internal/buildinfo"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/telemetry"
)

// ObserveEngine registers the gauges read from the engine and the dead
// letters at each scrape: the retry budget, the concurrency limit, paused
// intake, the oldest unsettled delivery, and the dead letters an operator
// watches (open by state, the oldest open one's age).
func observeEngine(m *telemetry.Metrics, engine func() dispatch.Status, dl *deadletter.Manager) error {
	source := func(name string) []attribute.KeyValue { return []attribute.KeyValue{attribute.String("source", name)} }
	one := func(v float64) []telemetry.Gauge { return []telemetry.Gauge{{Value: v}} }
	var errs []error
	bi := buildinfo.Get()
	errs = append(errs,
		m.Observe("handoff.build.info", "", "Always 1, with the running build's version, revision and Go version as labels.", func() []telemetry.Gauge {
			return []telemetry.Gauge{{Value: 1, Attrs: []attribute.KeyValue{
				attribute.String("version", bi.Version), attribute.String("revision", bi.Revision), attribute.String("go_version", bi.GoVersion)}}}
		}),
		m.Observe("handoff.budget.tokens", "", "Retry budget tokens available now.", func() []telemetry.Gauge {
			if b := engine().Budget; b != nil {
				return one(b.Tokens)
			}
			return nil
		}),
		m.ObserveCounter("handoff.budget.denied", "Re-attempts that found no retry budget token, since the start.", func() []telemetry.Gauge {
			if b := engine().Budget; b != nil {
				return one(float64(b.Denied))
			}
			return nil
		}),
		m.Observe("handoff.concurrency.limit", "", "The adaptive bound on calls to the app in flight.", func() []telemetry.Gauge {
			return one(float64(engine().Limit))
		}),
		m.Observe("handoff.goroutines", "", "Goroutines in the sidecar process: flat under steady load, whatever ran before.", func() []telemetry.Gauge {
			return one(float64(runtime.NumGoroutine()))
		}),
		m.Observe("handoff.journal.writable", "", "1 while the journal can be written; 0 while it has no room, and intake waits.", func() []telemetry.Gauge {
			if engine().JournalFull {
				return one(0)
			}
			return one(1)
		}),
		m.Observe("handoff.intake.paused", "", "1 while a source's fresh intake is paused (app unreachable, journal full, overload, budget spent).", func() []telemetry.Gauge {
			st := engine()
			paused := 0.0
			if st.Paused() != "" {
				paused = 1
			}
			var out []telemetry.Gauge
			for _, r := range st.Routes {
				out = append(out, telemetry.Gauge{Value: paused, Attrs: source(r.Name)})
			}
			return out
		}),
		m.Observe("handoff.oldest_unsettled_age", "s", "How long the oldest delivery a source has taken and not settled has been open.", func() []telemetry.Gauge {
			now := time.Now()
			var out []telemetry.Gauge
			for _, r := range engine().Routes {
				age := 0.0
				if !r.Oldest.IsZero() {
					age = now.Sub(r.Oldest).Seconds()
				}
				out = append(out, telemetry.Gauge{Value: age, Attrs: source(r.Name)})
			}
			return out
		}),
		m.Observe("handoff.deadletters.open", "", "Dead letters not closed, by source and state (from this replica's index).", func() []telemetry.Gauge {
			var out []telemetry.Gauge
			for _, name := range dl.SourceNames() {
				c, err := dl.Counts(name)
				if err != nil {
					continue
				}
				for _, st := range deadletter.States {
					if !st.Closed() {
						out = append(out, telemetry.Gauge{Value: float64(c.ByState[st]),
							Attrs: []attribute.KeyValue{attribute.String("source", name), attribute.String("state", string(st))}})
					}
				}
			}
			return out
		}),
		m.Observe("handoff.deadletters.oldest_open_age", "s", "How long ago the oldest open dead letter was dead-lettered; 0 when none is open.", func() []telemetry.Gauge {
			now := time.Now()
			var out []telemetry.Gauge
			for _, name := range dl.SourceNames() {
				c, err := dl.Counts(name)
				if err != nil {
					continue
				}
				age := 0.0
				if c.Open > 0 && !c.OldestOpen.IsZero() {
					age = now.Sub(c.OldestOpen).Seconds()
				}
				out = append(out, telemetry.Gauge{Value: age, Attrs: source(name)})
			}
			return out
		}),
	)
	return errors.Join(errs...)
}
