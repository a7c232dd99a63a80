package sidecar

import (
	"context"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"

	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/telemetry"
)

// otlp is where telemetry.otlp_endpoint pushes; its Endpoint is "" when
// nothing is pushed.
func otlp(t config.Telemetry, instance string) telemetry.OTLP {
	return telemetry.OTLP{Endpoint: t.OTLPEndpoint, Insecure: t.OTLPInsecure, SampleRatio: t.TraceSampleRatio,
		MetricInterval: t.OTLPMetricInterval.D(), Instance: instance}
}

// tracer is the engine's tracer: the given provider's (a test's), an OTLP
// exporter's when telemetry.otlp_endpoint is set, and nil (tracing off)
// otherwise.
func (s *Sidecar) tracer(tp trace.TracerProvider) (trace.Tracer, error) {
	if tp != nil {
		return telemetry.TracerOf(tp), nil
	}
	o := otlp(s.cfg.Telemetry, s.journal.InstanceID())
	if o.Endpoint == "" {
		return nil, nil
	}
	tr, stop, err := telemetry.NewTracer(o)
	if err != nil {
		return nil, configError(err)
	}
	s.stopTracing = stop
	return tr, nil
}

// newMetrics makes the sidecar's metrics: served on telemetry.metrics_listen,
// pushed to telemetry.otlp_endpoint every telemetry.otlp_metric_interval,
// and off (all but what the drain estimate needs) when neither is set.
// stop flushes the last push.
func newMetrics(t config.Telemetry, instance string) (*telemetry.Metrics, func(), error) {
	o := otlp(t, instance)
	mo := telemetry.MetricsOptions{Off: t.MetricsListen == "" && o.Endpoint == "", Resource: telemetry.Resource(instance)}
	if o.Endpoint != "" {
		r, err := telemetry.OTLPMetrics(o)
		if err != nil {
			return nil, nil, err
		}
		mo.Readers = []sdkmetric.Reader{r}
	}
	m, err := telemetry.NewMetrics(mo)
	if err != nil {
		return nil, nil, err
	}
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = m.Shutdown(ctx) // pushes what was measured since the last push
	}
	return m, stop, nil
}

// observe registers the gauges read at each scrape and makes the backlog
// sampler, whose readings give the drain estimate, and the activity history
// the console charts.
func (s *Sidecar) observe() error {
	if err := observeEngine(s.metrics, s.engine.Status, s.deadLetters); err != nil {
		return err
	}
	backlogs := make([]telemetry.BacklogSource, len(s.sources))
	names := make([]string, len(s.sources))
	for i, src := range s.sources {
		backlogs[i] = telemetry.BacklogSource{Name: src.name, Read: src.backlog}
		names[i] = src.name
	}
	s.activity = telemetry.NewHistory(s.metrics, names, telemetry.ActivityStep, telemetry.ActivitySpan, nil)
	var err error
	s.sampler, err = telemetry.NewSampler(backlogs, s.metrics, s.cfg.Telemetry.DrainWindow.D(), s.log)
	return err
}
