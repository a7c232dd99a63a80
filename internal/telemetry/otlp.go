package telemetry

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
)

// OTLP is where the sidecar pushes its traces and metrics: a collector's
// OTLP/gRPC endpoint.
type OTLP struct {
	Endpoint string
	Insecure bool
	// SampleRatio is the share of the traces started here that are kept;
	// a message's own trace is followed as its producer sampled it.
	SampleRatio float64
	// MetricInterval is how often the metrics are pushed.
	MetricInterval time.Duration
	// Instance names this replica to the collector.
	Instance string
}

// tracerName is the instrumentation scope of the sidecar's spans.
const tracerName = "handoff.dev/handoff"

// NewTracer returns the engine's tracer on an OTLP/gRPC exporter, and what
// flushes and stops it. The client connects lazily: an unreachable collector
// costs spans, never the start.
func NewTracer(o OTLP) (trace.Tracer, func(), error) {
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(o.Endpoint)}
	if o.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(context.Background(), opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry.otlp_endpoint: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(Resource(o.Instance)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))),
	)
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx) // flushes what is batched
	}
	return tp.Tracer(tracerName), stop, nil
}

// TracerOf is the engine's tracer from a provider given by the caller (a
// test's in-memory one).
func TracerOf(tp trace.TracerProvider) trace.Tracer { return tp.Tracer(tracerName) }

// OTLPMetrics is a reader that pushes the metrics to o's endpoint every
// o.MetricInterval. Like the traces' client, it connects lazily.
func OTLPMetrics(o OTLP) (sdkmetric.Reader, error) {
	opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithEndpoint(o.Endpoint)}
	if o.Insecure {
		opts = append(opts, otlpmetricgrpc.WithInsecure())
	}
	exp, err := otlpmetricgrpc.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry.otlp_endpoint: %w", err)
	}
	return sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(o.MetricInterval)), nil
}

// Resource names this replica to the collectors: the same instance id as
// in its Kafka groups and the dead-letter ledger.
func Resource(instance string) *resource.Resource {
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
