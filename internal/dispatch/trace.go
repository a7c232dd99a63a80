package dispatch

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"handoff.dev/handoff/internal/broker"
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
// the app receives in place of the message's. The span covers the attempt
// up to the settlement of its outcome (see attempt): the context returned
// carries it, so that the journal commits and the copy's publish made for
// that settlement are its children. With tracing off it returns ctx and a
// nil span: the hot path pays nothing then.
func (h *handoff) startAttempt(ctx context.Context, req *handler.Request) (context.Context, trace.Span) {
	if h.e.o.Tracer == nil {
		return ctx, nil
	}
	parent := traceContext.Extract(ctx, propagation.MapCarrier(h.msg.Headers))
	ctx, span := h.e.o.Tracer.Start(parent, "process "+h.r.Destination, trace.WithSpanKind(trace.SpanKindConsumer),
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
	traceContext.Inject(ctx, carrier)
	req.TraceParent, req.TraceState = carrier[headerTraceParent], carrier[headerTraceState]
	if h.rootTrace == "" && !trace.SpanContextFromContext(parent).IsValid() {
		// A message without a trace starts one here; its copies carry this
		// span's context, so that every attempt of it shares the trace. So
		// does one whose traceparent is there but not valid (all-zero ids,
		// a malformed value): W3C has it ignored, as if absent, and a copy
		// that kept it would start a second trace at the next attempt.
		h.rootTrace, h.rootState = req.TraceParent, req.TraceState
	}
	return ctx, span
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

// inAttempt reports whether ctx carries an attempt's span, to hang a child
// under. Work outside an attempt (a redelay, a copy published again after a
// crash, the fresh start of a renewed event) gets no span: it would be a
// trace of its own, joined to nothing.
func (h *handoff) inAttempt(ctx context.Context) bool {
	return h.e.o.Tracer != nil && trace.SpanFromContext(ctx).SpanContext().IsValid()
}

// startCommit starts the span of a journal commit of n records made while
// an attempt's span is in ctx; nil otherwise.
func (h *handoff) startCommit(ctx context.Context, n int) trace.Span {
	if !h.inAttempt(ctx) {
		return nil
	}
	_, span := h.e.o.Tracer.Start(ctx, "journal commit", trace.WithAttributes(
		attribute.Int("handoff.journal.records", n),
	))
	return span
}

// endCommit ends a journal commit's span.
func endCommit(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// startPublish starts the span of publishing a copy to dest and waiting for
// the broker's confirm (a producer's "send" span), made while an attempt's
// span is in ctx; otherwise it returns ctx and nil.
func (h *handoff) startPublish(ctx context.Context, dest broker.Destination) (context.Context, trace.Span) {
	if !h.inAttempt(ctx) {
		return ctx, nil
	}
	name := dest.String()
	return h.e.o.Tracer.Start(ctx, "publish "+name, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", h.r.System),
			attribute.String("messaging.operation.name", "publish"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", name),
			attribute.String("messaging.message.id", h.trail.EventID),
			attribute.String("handoff.source", h.r.Name),
		))
}

// endPublish ends a publish's span after tries tries. err is the last
// failed try's: a copy confirmed only after a retry has error status too,
// so that a broker that makes publishes wait shows in the trace.
func endPublish(span trace.Span, tries int, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.Int("handoff.publish.tries", tries))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
