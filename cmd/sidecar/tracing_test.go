package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Every attempt of one message is a span of one trace: the message's own
// trace when it carries a traceparent, else the one its first attempt
// started, which its retry copy carries. The app receives each attempt's
// span as its traceparent.
func TestTraceAcrossRetryCopiesRabbitMQ(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	t.Cleanup(func() { _ = conn.Close() })
	tier := 200 * time.Millisecond
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, func(w http.ResponseWriter, c call, prior []call) {
		if len(prior) == 0 {
			w.WriteHeader(http.StatusServiceUnavailable) // once: retried through the tier
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	s := startSidecarWith(t, testConfig(a.url(), q, tier), hooks{tracerProvider: tp})

	const producerTrace, producerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	publish(t, conn, q,
		publishing{MessageId: "untraced", Body: []byte("x")},
		publishing{MessageId: "traced", Body: []byte("y"), Headers: amqp.Table{"traceparent": "00-" + producerTrace + "-" + producerSpan + "-01"}},
	)
	waitFor(t, 20*time.Second, "two attempts of each", func() bool {
		return len(a.callsFor("untraced")) == 2 && len(a.callsFor("traced")) == 2 && len(rec.Ended()) == 4
	})
	s.stop(t)

	spans := map[string][]sdktrace.ReadOnlySpan{}
	for _, sp := range rec.Ended() {
		for _, kv := range sp.Attributes() {
			if kv.Key == "messaging.message.id" {
				spans[kv.Value.AsString()] = append(spans[kv.Value.AsString()], sp)
			}
		}
	}
	for _, id := range []string{"untraced", "traced"} {
		ss := spans[id]
		if len(ss) != 2 {
			t.Fatalf("%s: %d spans, want 2", id, len(ss))
		}
		if ss[0].SpanContext().TraceID() != ss[1].SpanContext().TraceID() {
			t.Errorf("%s: its attempts are in two traces: %s, %s", id, ss[0].SpanContext().TraceID(), ss[1].SpanContext().TraceID())
		}
		// The app saw each attempt's span as its traceparent.
		for i, c := range a.callsFor(id) {
			tp := c.Header.Get("Traceparent")
			found := false
			for _, sp := range ss {
				found = found || strings.Contains(tp, sp.SpanContext().SpanID().String())
			}
			if !found || !strings.Contains(tp, ss[0].SpanContext().TraceID().String()) {
				t.Errorf("%s: call %d's traceparent %q names none of its attempts' spans", id, i+1, tp)
			}
		}
		if ss[0].Name() != "process "+q || ss[0].SpanKind().String() != "consumer" {
			t.Errorf("%s: span %q of kind %s", id, ss[0].Name(), ss[0].SpanKind())
		}
	}
	if got := spans["traced"][0].SpanContext().TraceID().String(); got != producerTrace {
		t.Errorf("the traced message's attempts are in trace %s, not its producer's %s", got, producerTrace)
	}
	if got := spans["traced"][0].Parent().SpanID().String(); got != producerSpan {
		t.Errorf("the traced message's first attempt's parent is %s, not the producer's span %s", got, producerSpan)
	}
}
