package main

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/sidecar"
	"handoff.dev/handoff/internal/testkit"
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
	s := startSidecarWith(t, testConfig(a.url(), q, tier), sidecar.Options{TracerProvider: tp})

	const producerTrace, producerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	publish(t, conn, q,
		publishing{MessageId: "untraced", Body: []byte("x")},
		publishing{MessageId: "traced", Body: []byte("y"), Headers: amqp.Table{"traceparent": "00-" + producerTrace + "-" + producerSpan + "-01"}},
		// Present but invalid, which W3C says to treat as absent: the
		// first attempt starts the trace and the copy carries it, not the
		// header it came with.
		publishing{MessageId: "zero-parent", Body: []byte("z"), Headers: amqp.Table{"traceparent": "00-00000000000000000000000000000000-0000000000000000-01"}},
		publishing{MessageId: "bad-parent", Body: []byte("w"), Headers: amqp.Table{"traceparent": "00-not-a-trace-01"}},
	)
	ids := []string{"untraced", "traced", "zero-parent", "bad-parent"}
	testkit.Eventually(t, 20*time.Second, "two attempts of each", func() bool {
		spans := attemptSpans(rec.Ended())
		for _, id := range ids {
			if len(a.callsFor(id)) != 2 || len(spans[id]) != 2 {
				return false
			}
		}
		return true
	})
	s.stop(t)

	ended := rec.Ended()
	spans := attemptSpans(ended)
	for _, id := range ids {
		ss := spans[id]
		if len(ss) != 2 {
			t.Fatalf("%s: %d spans, want 2", id, len(ss))
		}
		if !ss[0].SpanContext().TraceID().IsValid() {
			t.Errorf("%s: its first attempt has no valid trace", id)
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
		// The attempt that failed lasted until its retry copy was
		// confirmed and its source acked: the journal commit and the
		// publish are its children.
		retried := childrenOf(ended, ss[0])
		pub := retried["publish retry.200ms"]
		if len(pub) != 1 || len(retried["journal commit"]) == 0 {
			t.Errorf("%s: the retried attempt's children are %v, want a publish retry.200ms and a journal commit", id, names(retried))
		} else {
			if pub[0].SpanKind().String() != "producer" || spanAttr(pub[0], "messaging.operation.type") != "send" ||
				spanAttr(pub[0], "messaging.destination.name") != "retry.200ms" {
				t.Errorf("%s: publish span of kind %s with %v", id, pub[0].SpanKind(), pub[0].Attributes())
			}
			if pub[0].EndTime().After(ss[0].EndTime()) {
				t.Errorf("%s: the publish ended after its attempt's span", id)
			}
		}
		// The attempt that succeeded committed its outcome before the ack.
		if handled := childrenOf(ended, ss[1]); len(handled["journal commit"]) == 0 {
			t.Errorf("%s: the handled attempt's children are %v, want a journal commit", id, names(handled))
		}
	}
	if got := spans["traced"][0].SpanContext().TraceID().String(); got != producerTrace {
		t.Errorf("the traced message's attempts are in trace %s, not its producer's %s", got, producerTrace)
	}
	if got := spans["traced"][0].Parent().SpanID().String(); got != producerSpan {
		t.Errorf("the traced message's first attempt's parent is %s, not the producer's span %s", got, producerSpan)
	}
}

// In batch mode the app gets one request for several attempts, and no
// header says whose trace it is in: each event of the batch carries its own
// attempt's span as its traceparent extension, in its message's trace.
func TestTraceInBatchEventsRabbitMQ(t *testing.T) {
	t.Parallel()
	for _, tr := range []string{"http", "grpc"} {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			testTraceInBatchEvents(t, tr)
		})
	}
}

func testTraceInBatchEvents(t *testing.T, transport string) {
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a, url := scriptApp(t, transport, status(http.StatusOK))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	cfg := testConfig(url, q, tier)
	cfg.Handler.Batch = config.Batch{MaxMessages: 4, MaxWait: config.Duration(200 * time.Millisecond)}
	s := startSidecarWith(t, cfg, sidecar.Options{TracerProvider: tp})

	producers := map[string]string{ // message id → the trace its producer started
		"traced-1": "4bf92f3577b34da6a3ce929d0e0e4736",
		"traced-2": "0af7651916cd43dd8448eb211c80319c",
	}
	msgs := []publishing{{MessageId: "untraced-1", Body: []byte("a")}, {MessageId: "untraced-2", Body: []byte("b")}}
	for id, trace := range producers {
		msgs = append(msgs, publishing{MessageId: id, Body: []byte(id),
			Headers: amqp.Table{"traceparent": "00-" + trace + "-00f067aa0ba902b7-01"}})
	}
	publish(t, conn, q, msgs...)
	testkit.Eventually(t, 20*time.Second, "an ended attempt span for each message", func() bool {
		return len(a.allCalls()) == len(msgs) && len(attemptSpans(rec.Ended())) == len(msgs)
	})
	s.stop(t)

	if a.largestBatch() < 2 {
		t.Fatalf("no request carried more than %d message: not a batch", a.largestBatch())
	}
	spans := attemptSpans(rec.Ended())
	for _, m := range msgs {
		id := m.MessageId
		calls, ss := a.callsFor(id), spans[id]
		if len(calls) != 1 || len(ss) != 1 {
			t.Errorf("%s: %d calls and %d attempt spans, want one of each", id, len(calls), len(ss))
			continue
		}
		sc := ss[0].SpanContext()
		want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
		if got := calls[0].Header.Get("Ce-Traceparent"); got != want {
			t.Errorf("%s: its event's traceparent is %q, want its attempt's span %q", id, got, want)
		}
		if trace, ok := producers[id]; ok && sc.TraceID().String() != trace {
			t.Errorf("%s: its attempt is in trace %s, not its producer's %s", id, sc.TraceID(), trace)
		}
	}
}

// attemptSpans are the attempt ("process") spans among spans, by message id,
// in the order they started.
func attemptSpans(spans []sdktrace.ReadOnlySpan) map[string][]sdktrace.ReadOnlySpan {
	out := map[string][]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		if !strings.HasPrefix(sp.Name(), "process ") {
			continue
		}
		id := spanAttr(sp, "messaging.message.id")
		out[id] = append(out[id], sp)
	}
	for _, ss := range out {
		slices.SortFunc(ss, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	}
	return out
}

// childrenOf are the spans whose parent is parent, by name.
func childrenOf(spans []sdktrace.ReadOnlySpan, parent sdktrace.ReadOnlySpan) map[string][]sdktrace.ReadOnlySpan {
	out := map[string][]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		if sp.Parent().SpanID() == parent.SpanContext().SpanID() && sp.Parent().TraceID() == parent.SpanContext().TraceID() {
			out[sp.Name()] = append(out[sp.Name()], sp)
		}
	}
	return out
}

func names(spans map[string][]sdktrace.ReadOnlySpan) []string {
	var out []string
	for name, ss := range spans {
		for range ss {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// spanAttr is a span's string attribute key, "" when it has none.
func spanAttr(sp sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.AsString()
		}
	}
	return ""
}
