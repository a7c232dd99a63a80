package telemetry

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"handoff.dev/handoff/internal/redact"
)

// drainReadings is how many times a source's backlog is read in the drain
// window (telemetry.drain_window): every 5 s in the default minute.
const drainReadings = 12

// minBacklogRead is the least time a backlog read is given. A reading's
// time is its interval, but with a short drain window on a busy broker
// every read of a tenth of a second timed out and no estimate was ever
// made; a slow read only delays the next reading.
const minBacklogRead = 2 * time.Second

// Backlog is one source's backlog reading: the messages waiting and, where
// the broker says (known), the count of messages ever produced to it.
type Backlog func(ctx context.Context) (backlog, produced int64, known bool, err error)

// BacklogSource is a source whose backlog a Sampler reads.
type BacklogSource struct {
	Name string
	Read Backlog
}

// Sampler reads every source's backlog at intervals and estimates its
// arrival and completion rates and its drain time (seed 000: B/(μ−λ)).
type Sampler struct {
	sources []BacklogSource
	metrics *Metrics
	log     *slog.Logger
	est     map[string]*Drain
	every   time.Duration
}

// NewSampler estimates each source's rates over window, reading its backlog
// drainReadings times in it, and registers the backlog's gauges in m.
func NewSampler(sources []BacklogSource, m *Metrics, window time.Duration, log *slog.Logger) (*Sampler, error) {
	d := &Sampler{sources: sources, metrics: m, log: log, est: map[string]*Drain{}, every: window / drainReadings}
	for _, s := range sources {
		d.est[s.Name] = NewDrain(window)
	}
	return d, d.observe()
}

// Estimate is the named source's latest estimate; false until it has one.
func (d *Sampler) Estimate(source string) (Estimate, bool) {
	if e := d.est[source]; e != nil {
		return e.Estimate()
	}
	return Estimate{}, false
}

// Run reads the backlogs until ctx ends.
func (d *Sampler) Run(ctx context.Context) error {
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

func (d *Sampler) read(ctx context.Context) {
	for _, s := range d.sources {
		if s.Read == nil {
			continue
		}
		// Dated when asked, not when answered: on a busy broker the answer
		// can take a while, and the rates are over the readings' dates.
		at := time.Now()
		taken := d.metrics.Taken(s.Name)
		rctx, cancel := context.WithTimeout(ctx, max(d.every, minBacklogRead))
		b, produced, known, err := s.Read(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				d.log.Debug("backlog unknown", "source", s.Name, "err", redact.Error(err))
			}
			continue
		}
		if known {
			// The group's consumption, all replicas together, as its
			// committed offsets say: this replica's own count would make μ
			// one replica's share of a group-wide backlog.
			taken = produced - b
		}
		d.est[s.Name].Add(DrainSample{At: at, Backlog: b, Taken: taken,
			Produced: produced, ProducedKnown: known})
	}
}

// observe registers the backlog's gauges: B, λ, μ and the drain time
// (+Inf when μ ≤ λ: not converging).
func (d *Sampler) observe() error {
	for _, g := range []struct {
		name, unit, desc string
		pick             func(Estimate) float64
	}{
		{"handoff.backlog.messages", "", "Messages waiting in the source: the Kafka group's lag, the RabbitMQ queue's ready count.",
			func(e Estimate) float64 { return e.Backlog }},
		{"handoff.arrival.rate", "", "Messages produced to the source a second (λ), over telemetry.drain_window.",
			func(e Estimate) float64 { return e.Arrival }},
		{"handoff.completion.rate", "", "Messages the sidecar took from the source a second (μ), over telemetry.drain_window.",
			func(e Estimate) float64 { return e.Completion }},
		{"handoff.backlog.drain", "s", "How long the backlog takes to drain at these rates, B/(μ−λ); +Inf when μ ≤ λ (not converging).",
			func(e Estimate) float64 { return e.Drain }},
	} {
		err := d.metrics.Observe(g.name, g.unit, g.desc, func() []Gauge {
			var out []Gauge
			for _, s := range d.sources {
				if e, ok := d.est[s.Name].Estimate(); ok {
					out = append(out, Gauge{Value: g.pick(e), Attrs: []attribute.KeyValue{attribute.String("source", s.Name)}})
				}
			}
			return out
		})
		if err != nil {
			return err
		}
	}
	return nil
}
