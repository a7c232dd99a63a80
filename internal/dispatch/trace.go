package dispatch

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
)

// traceContext is W3C trace context: traceparent and tracestate.
var traceContext = propagation.TraceContext{}

// The header names of the trace context, as W3C spells them.
const (
	headerTraceParent = "traceparent"
	headerTraceState  = "tracestate"
)

// startAttempt starts the span of one attempt (messaging semantic
// conventions: a consumer's "process" span), a child of the message's trace
// context when it carries one, and puts the span's context on req, which
// the app receives in place of the message's. It returns nil when tracing
// is off: the hot path pays nothing then.
func (h *handoff) startAttempt(ctx context.Context, req *handler.Request) trace.Span {
	if h.e.o.Tracer == nil {
		return nil
	}
	parent := traceContext.Extract(ctx, propagation.MapCarrier(h.msg.Headers))
	_, span := h.e.o.Tracer.Start(parent, "process "+h.r.Destination, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", h.r.System),
			attribute.String("messaging.operation.name", "process"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", h.r.Destination),
			attribute.String("messaging.message.id", h.trail.EventID),
			attribute.String("handoff.source", h.r.Name),
			attribute.Int("handoff.attempt", req.Attempt),
			attribute.Int("handoff.hop", h.trail.Hops),
		))
	carrier := propagation.MapCarrier{}
	traceContext.Inject(trace.ContextWithSpan(ctx, span), carrier)
	req.TraceParent, req.TraceState = carrier[headerTraceParent], carrier[headerTraceState]
	if h.rootTrace == "" && h.msg.Headers[headerTraceParent] == "" {
		// A message without a trace starts one here; its copies carry this
		// span's context, so that every attempt of it shares the trace.
		h.rootTrace, h.rootState = req.TraceParent, req.TraceState
	}
	return span
}

// endAttempt ends an attempt's span with its outcome.
func endAttempt(span trace.Span, res handler.Result) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String("handoff.outcome", res.Outcome.String()))
	if res.Status != 0 {
		span.SetAttributes(attribute.Int("handoff.app.status", res.Status))
	}
	if res.Outcome != budget.Success && res.Outcome != budget.Drop {
		span.SetStatus(codes.Error, res.Detail)
	}
	span.End()
}
