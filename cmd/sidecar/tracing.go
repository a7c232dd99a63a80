package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"handoff.dev/handoff/internal/config"
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
	res := resource.NewSchemaless(
		serviceName.String("handoff"),
		serviceInstance.String(instance),
	)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.TraceSampleRatio))),
	)
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx) // flushes what is batched
	}
	return tp.Tracer("handoff.dev/handoff"), stop, nil
}

// The resource's attributes (OpenTelemetry semantic conventions).
var (
	serviceName     = attribute.Key("service.name")
	serviceInstance = attribute.Key("service.instance.id")
)
