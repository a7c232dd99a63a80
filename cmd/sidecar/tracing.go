package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/telemetry"
)

// tracer returns the engine's tracer and what stops it: the test's
// provider when a test gives one, an OTLP/gRPC exporter when
// telemetry.otlp_endpoint is set, and nil (tracing off) otherwise. Traces
// started here are kept at telemetry.trace_sample_ratio; a message's own
// trace is followed as its producer sampled it.
func tracer(t config.Telemetry, hk hooks, instance string) (trace.Tracer, func(), error) {
	if hk.tracerProvider != nil {
		return hk.tracerProvider.Tracer("handoff.dev/handoff"), func() {}, nil
	}
	if t.OTLPEndpoint == "" {
		return nil, func() {}, nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(t.OTLPEndpoint)}
	if t.OTLPInsecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	// The client connects lazily: an unreachable collector costs spans,
	// never the start.
	exp, err := otlptracegrpc.New(context.Background(), opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry.otlp_endpoint: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(sidecarResource(instance)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.TraceSampleRatio))),
	)
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx) // flushes what is batched
	}
	return tp.Tracer("handoff.dev/handoff"), stop, nil
}

// newMetrics makes the sidecar's metrics: served on telemetry.metrics_listen,
// pushed to telemetry.otlp_endpoint every telemetry.otlp_metric_interval,
// and off (all but what the drain estimate needs) when neither is set.
// stop flushes the last push.
func newMetrics(t config.Telemetry, instance string) (*telemetry.Metrics, func(), error) {
	o := telemetry.MetricsOptions{Off: t.MetricsListen == "" && t.OTLPEndpoint == "", Resource: sidecarResource(instance)}
	if t.OTLPEndpoint != "" {
		opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithEndpoint(t.OTLPEndpoint)}
		if t.OTLPInsecure {
			opts = append(opts, otlpmetricgrpc.WithInsecure())
		}
		// Like the traces' client, it connects lazily.
		exp, err := otlpmetricgrpc.New(context.Background(), opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("telemetry.otlp_endpoint: %w", err)
		}
		o.Readers = append(o.Readers, sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(t.OTLPMetricInterval.D())))
	}
	m, err := telemetry.NewMetrics(o)
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

// sidecarResource names this replica to the collectors: the same instance
// id as in its Kafka groups and the dead-letter ledger.
func sidecarResource(instance string) *resource.Resource {
	return resource.NewSchemaless(
		serviceName.String("handoff"),
		serviceInstance.String(instance),
	)
}

// The resource's attributes (OpenTelemetry semantic conventions).
var (
	serviceName     = attribute.Key("service.name")
	serviceInstance = attribute.Key("service.instance.id")
)
