package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
)

// Metrics are the sidecar's instruments, made through the OpenTelemetry SDK
// and served in the Prometheus text format by Handler (on
// telemetry.metrics_listen, /metrics). The hot path's calls (Received,
// Attempted) find their attribute sets in a cache: no allocation per
// message once a source's outcomes have been seen. It is safe for
// concurrent use.
type Metrics struct {
	// off: nothing reads the metrics (no /metrics, no OTLP): the hot
	// path's calls keep only the counts the drain estimate needs.
	off      bool
	provider *sdkmetric.MeterProvider
	registry *prometheus.Registry
	meter    metric.Meter

	// received and outcomes are read from counts kept here at each
	// collection: a message then costs them an atomic add, where the SDK's
	// counters resolve the attribute set and aggregate on every Add.
	received    metric.Int64ObservableCounter
	outcomes    metric.Int64ObservableCounter
	duration    metric.Float64Histogram
	retries     metric.Int64Counter
	deadLetters metric.Int64Counter
	duplicates  metric.Int64Counter
	commits     metric.Float64Histogram
	evicted     metric.Int64Counter

	sets    sync.Map // setKey → *series
	sources sync.Map // source → *sourceCounts
	// attempts holds what Attempted needs of sets (see attemptSeries).
	attempts   atomic.Pointer[map[attemptKey]attemptSeries]
	attemptsMu sync.Mutex
}

// sourceCounts are the messages a source has had taken since the start.
type sourceCounts struct {
	taken    atomic.Int64 // fresh messages, for the drain estimate
	received atomic.Int64 // fresh messages and retry copies
	// handled, retried, deadLettered and other are for the log's summary
	// and the activity history: kept whether or not anything reads the
	// metrics.
	handled, retried, deadLettered, other atomic.Int64
	// received's attributes, for the collection's callback.
	obs []metric.ObserveOption
}

// setKey names one cached series: the metric, the source, at most one more
// label, and the attempt label of outcomes.
type setKey struct{ metric, source, name, value, attempt string }

// MetricsOptions configures Metrics.
type MetricsOptions struct {
	// Off measures nothing but what the drain estimate needs (Taken): for
	// a sidecar whose metrics nothing reads.
	Off bool
	// Readers are where the metrics go besides the Prometheus registry:
	// an OTLP exporter's periodic reader.
	Readers []sdkmetric.Reader
	// Resource names the sidecar to the readers that push (OTLP).
	Resource *resource.Resource
}

// NewMetrics makes the instruments, their Prometheus registry and the
// readers o names.
func NewMetrics(o MetricsOptions) (*Metrics, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exp)}
	for _, r := range o.Readers {
		opts = append(opts, sdkmetric.WithReader(r))
	}
	if o.Resource != nil {
		opts = append(opts, sdkmetric.WithResource(o.Resource))
	}
	if os.Getenv("OTEL_METRICS_EXEMPLAR_FILTER") == "" {
		// Measurements are recorded without a span in their context, so
		// the default filter (a sampled span's) never takes one: it is
		// only a check per measurement. The variable still chooses.
		opts = append(opts, sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	}
	provider := sdkmetric.NewMeterProvider(append(opts,
		// Attempts from a millisecond to a minute: an app's answers.
		sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Name: "handoff.handler.duration"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{
				Boundaries: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
			}},
		)),
		// Journal commits: a group commit's fsync, from 100µs to a second.
		sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Name: "handoff.journal.commit.duration"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{
				Boundaries: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1},
			}},
		)),
	)...)
	m := &Metrics{off: o.Off, provider: provider, registry: reg, meter: provider.Meter("handoff.dev/handoff")}
	for _, c := range []struct {
		dst        *metric.Int64Counter
		name, desc string
	}{
		{&m.retries, "handoff.retries.scheduled", "Copies moved to a retry tier."},
		{&m.deadLetters, "handoff.deadletters", "Copies moved to the dead-letter destination, by reason."},
		{&m.duplicates, "handoff.journal.duplicates.suppressed", "Redeliveries settled from the journal without calling the app."},
		{&m.evicted, "handoff.journal.evicted", "Settled hand-offs dropped from the journal, the earliest first, to keep it within journal.max_size."},
	} {
		if *c.dst, err = m.meter.Int64Counter(c.name, metric.WithDescription(c.desc)); err != nil {
			return nil, err
		}
	}
	if m.received, err = m.meter.Int64ObservableCounter("handoff.messages.received",
		metric.WithDescription("Messages taken from a source: fresh ones and retry copies.")); err != nil {
		return nil, err
	}
	if m.outcomes, err = m.meter.Int64ObservableCounter("handoff.outcomes",
		metric.WithDescription("Attempts by their outcome (success, retry, overload, defer, permanent, ...).")); err != nil {
		return nil, err
	}
	if !m.off {
		if _, err = m.meter.RegisterCallback(m.observeCounts, m.received, m.outcomes); err != nil {
			return nil, err
		}
	}
	if m.duration, err = m.meter.Float64Histogram("handoff.handler.duration", metric.WithUnit("s"),
		metric.WithDescription("How long the app took to answer an attempt, by its outcome.")); err != nil {
		return nil, err
	}
	if m.commits, err = m.meter.Float64Histogram("handoff.journal.commit.duration", metric.WithUnit("s"),
		metric.WithDescription("How long a journal group commit took.")); err != nil {
		return nil, err
	}
	// Exported from the start, at zero: an alert on its increase has a
	// series to read before the first hand-off is dropped.
	m.Evicted(0)
	return m, nil
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// Shutdown stops the instruments' provider.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }

// series is one set of attributes, as the options a measurement takes:
// kept, so that a measurement passes an existing slice and allocates
// nothing.
type series struct {
	add []metric.AddOption
	rec []metric.RecordOption
	obs []metric.ObserveOption
	// n is the count of an observed counter's series (outcomes).
	n atomic.Int64
}

// series returns the cached series of a source with one more label (name
// empty: none) and, for outcomes, the attempt label.
func (m *Metrics) series(k setKey) *series {
	if v, ok := m.sets.Load(k); ok {
		return v.(*series)
	}
	attrs := []attribute.KeyValue{attribute.String("source", k.source)}
	if k.name != "" {
		attrs = append(attrs, attribute.String(k.name, k.value))
	}
	if k.attempt != "" {
		attrs = append(attrs, attribute.String("attempt", k.attempt))
	}
	o := metric.WithAttributeSet(attribute.NewSet(attrs...))
	v, _ := m.sets.LoadOrStore(k, &series{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}, obs: []metric.ObserveOption{o}})
	return v.(*series)
}

// observeCounts reports the counts kept for the observed counters.
func (m *Metrics) observeCounts(_ context.Context, o metric.Observer) error {
	m.sources.Range(func(_, v any) bool {
		c := v.(*sourceCounts)
		if n := c.received.Load(); n > 0 {
			o.ObserveInt64(m.received, n, c.obs...)
		}
		return true
	})
	m.sets.Range(func(k, v any) bool {
		if k.(setKey).metric == "outcomes" {
			s := v.(*series)
			o.ObserveInt64(m.outcomes, s.n.Load(), s.obs...)
		}
		return true
	})
	return nil
}

// Received counts a message taken from source: a fresh one from its
// backlog, or a retry copy.
func (m *Metrics) Received(source string, retry bool) {
	c := m.countsOf(source)
	if !retry {
		c.taken.Add(1)
	}
	if m.off {
		return
	}
	c.received.Add(1)
}

// Totals are what a source's messages came to since the start.
type Totals struct {
	// Taken is the fresh messages taken; Handled the attempts the app
	// answered with success; Retried the copies moved to a retry tier;
	// DeadLettered those moved to the dead-letter destination; Other those
	// settled another way (dropped by the app's answer, or a redelivery
	// settled from the journal).
	Taken, Handled, Retried, DeadLettered, Other int64
}

// Totals reads source's totals.
func (m *Metrics) Totals(source string) Totals {
	c := m.countsOf(source)
	return Totals{Taken: c.taken.Load(), Handled: c.handled.Load(), Retried: c.retried.Load(),
		DeadLettered: c.deadLettered.Load(), Other: c.other.Load()}
}

// Taken counts the fresh messages taken from source since the start: the
// completions the drain estimate's μ is taken from.
func (m *Metrics) Taken(source string) int64 { return m.countsOf(source).taken.Load() }

func (m *Metrics) countsOf(source string) *sourceCounts {
	if v, ok := m.sources.Load(source); ok {
		return v.(*sourceCounts)
	}
	c := &sourceCounts{obs: []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("source", source)))}}
	v, _ := m.sources.LoadOrStore(source, c)
	return v.(*sourceCounts)
}

// Attempted counts an attempt's outcome, and whether it was the message's
// first (attempt="first") or a re-attempt ("again"): the first-failure
// rate of an incident is over first attempts. The latency histogram is by
// outcome only.
func (m *Metrics) Attempted(source, outcome string, first bool, took time.Duration) {
	a := m.attemptSeries(attemptKey{source, outcome, first})
	if a.settles != nil {
		a.settles.Add(1)
	}
	if m.off {
		return
	}
	a.outcomes.n.Add(1)
	m.duration.Record(context.Background(), took.Seconds(), a.duration.rec...)
}

// attemptKey names the series one attempt is counted in.
type attemptKey struct {
	source, outcome string
	first           bool
}

// attemptSeries are the series of one attemptKey, and the source's count
// the outcome settles into: handled on success, other on drop.
type attemptSeries struct {
	outcomes, duration *series
	settles            *atomic.Int64
}

// attemptSeries finds k's series in a map read without a lock: every
// attempt looks them up, and a map of the key's own type hashes it faster
// than sync.Map's look-up through an interface. Writers copy the map.
func (m *Metrics) attemptSeries(k attemptKey) attemptSeries {
	if p := m.attempts.Load(); p != nil {
		if a, ok := (*p)[k]; ok {
			return a
		}
	}
	attempt := "again"
	if k.first {
		attempt = "first"
	}
	a := attemptSeries{
		outcomes: m.series(setKey{metric: "outcomes", source: k.source, name: "outcome", value: k.outcome, attempt: attempt}),
		duration: m.series(setKey{metric: "duration", source: k.source, name: "outcome", value: k.outcome}),
	}
	switch k.outcome {
	case "success":
		a.settles = &m.countsOf(k.source).handled
	case "drop":
		a.settles = &m.countsOf(k.source).other
	}
	m.attemptsMu.Lock()
	defer m.attemptsMu.Unlock()
	next := make(map[attemptKey]attemptSeries)
	if p := m.attempts.Load(); p != nil {
		for k, v := range *p {
			next[k] = v
		}
	}
	next[k] = a
	m.attempts.Store(&next)
	return a
}

// Retried counts a copy moved to a retry tier.
func (m *Metrics) Retried(source, tier string) {
	m.countsOf(source).retried.Add(1)
	if m.off {
		return
	}
	m.retries.Add(context.Background(), 1, m.series(setKey{metric: "retries", source: source, name: "tier", value: tier}).add...)
}

// DeadLettered counts a copy moved to the dead-letter destination.
func (m *Metrics) DeadLettered(source, reason string) {
	m.countsOf(source).deadLettered.Add(1)
	if m.off {
		return
	}
	m.deadLetters.Add(context.Background(), 1, m.series(setKey{metric: "deadletters", source: source, name: "reason", value: reason}).add...)
}

// Duplicate counts a redelivery settled from the journal.
func (m *Metrics) Duplicate(source string) {
	m.countsOf(source).other.Add(1)
	if m.off {
		return
	}
	m.duplicates.Add(context.Background(), 1, m.series(setKey{metric: "duplicates", source: source}).add...)
}

// Committed records one journal group commit's duration.
func (m *Metrics) Committed(took time.Duration) {
	if m.off {
		return
	}
	m.commits.Record(context.Background(), took.Seconds())
}

// Evicted counts settled hand-offs the journal dropped to keep within its
// size bound.
func (m *Metrics) Evicted(n int) {
	if m.off {
		return
	}
	m.evicted.Add(context.Background(), int64(n))
}

// Gauge is one observed value with its attributes.
type Gauge struct {
	Value float64
	Attrs []attribute.KeyValue
}

// Observe registers a gauge read at each scrape from read.
func (m *Metrics) Observe(name, unit, desc string, read func() []Gauge) error {
	opts := []metric.Float64ObservableGaugeOption{metric.WithDescription(desc)}
	if unit != "" {
		opts = append(opts, metric.WithUnit(unit))
	}
	g, err := m.meter.Float64ObservableGauge(name, opts...)
	if err != nil {
		return err
	}
	_, err = m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, v := range read() {
			o.ObserveFloat64(g, v.Value, metric.WithAttributes(v.Attrs...))
		}
		return nil
	}, g)
	return err
}

// ObserveCounter registers a counter whose running total is read at each
// scrape from read (a count kept elsewhere, since the start).
func (m *Metrics) ObserveCounter(name, desc string, read func() []Gauge) error {
	c, err := m.meter.Float64ObservableCounter(name, metric.WithDescription(desc))
	if err != nil {
		return err
	}
	_, err = m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, v := range read() {
			o.ObserveFloat64(c, v.Value, metric.WithAttributes(v.Attrs...))
		}
		return nil
	}, c)
	return err
}
