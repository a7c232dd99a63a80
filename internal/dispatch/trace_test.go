package dispatch

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
)

// countingTracer counts the End calls of every span it starts: a span must
// end exactly once, and the SDK ignores a second End without a word.
type countingTracer struct {
	trace.Tracer
	mu   sync.Mutex
	ends map[trace.SpanID]int
}

func (c *countingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	ctx, s := c.Tracer.Start(ctx, name, opts...)
	cs := &countingSpan{Span: s, c: c}
	return trace.ContextWithSpan(ctx, cs), cs
}

type countingSpan struct {
	trace.Span
	c *countingTracer
}

func (s *countingSpan) End(opts ...trace.SpanEndOption) {
	s.c.mu.Lock()
	s.c.ends[s.SpanContext().SpanID()]++
	s.c.mu.Unlock()
	s.Span.End(opts...)
}

// traced gives e a tracer that records into the returned recorder.
func traced(t *testing.T, e *Engine) (*tracetest.SpanRecorder, *countingTracer) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ct := &countingTracer{Tracer: tp.Tracer("test"), ends: map[trace.SpanID]int{}}
	e.o.Tracer = ct
	return rec, ct
}

func named(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func intAttr(s sdktrace.ReadOnlySpan, key string) (int64, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.AsInt64(), true
		}
	}
	return 0, false
}

// An attempt's span lasts until its outcome is settled: the journal commits
// and the publish of its copy are its children, it ends after them, and it
// ends once, however the attempt ends.
func TestAttemptSpanCoversItsSettlement(t *testing.T) {
	tests := []struct {
		name      string
		results   []budget.Outcome
		failures  int32  // transfers that fail before one is confirmed
		publish   string // the name of the copy's publish span, if any
		attempts  int    // process spans
		committed bool   // the last attempt commits to the journal
		wantEvent string // the delivery's settlement
	}{
		{name: "handled", results: []budget.Outcome{budget.Success}, attempts: 1, committed: true, wantEvent: "ack"},
		{name: "retry copy", results: []budget.Outcome{budget.Retry}, failures: 1, publish: "publish retry.1s",
			attempts: 1, committed: true, wantEvent: "ack"},
		{name: "dead letter", results: []budget.Outcome{budget.Permanent}, publish: "publish dlq",
			attempts: 1, committed: true, wantEvent: "ack"},
		{name: "unreachable, then handled", results: []budget.Outcome{budget.Unreachable, budget.Success},
			attempts: 2, committed: true, wantEvent: "ack"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.results...)
			r.app.probeOK.Store(true)
			r.tr.fails.Store(tt.failures)
			e := r.engine(4, r.delivery("a"))
			rec, ct := traced(t, e)
			run(t, e, func() bool { return len(named(rec.Ended(), "process ")) == tt.attempts })

			spans := rec.Ended()
			process := named(spans, "process ")
			if len(process) != tt.attempts {
				t.Fatalf("%d attempt spans, want %d", len(process), tt.attempts)
			}
			last := process[len(process)-1]
			children := map[string][]sdktrace.ReadOnlySpan{}
			for _, s := range spans {
				if s.Parent().SpanID() == last.SpanContext().SpanID() {
					children[s.Name()] = append(children[s.Name()], s)
					if s.EndTime().After(last.EndTime()) {
						t.Errorf("%q ended after its attempt's span", s.Name())
					}
				}
			}
			if got := len(children["journal commit"]) > 0; got != tt.committed {
				t.Errorf("journal commit under the attempt: %v, want %v (children %v)", got, tt.committed, children)
			}
			for _, c := range children["journal commit"] {
				if n, ok := intAttr(c, "handoff.journal.records"); !ok || n < 1 {
					t.Errorf("journal commit records %d (%v), want at least 1", n, ok)
				}
			}
			pubs := children[tt.publish]
			if tt.publish != "" {
				if len(pubs) != 1 {
					t.Fatalf("%d %q spans under the attempt, want 1 (children %v)", len(pubs), tt.publish, children)
				}
				p := pubs[0]
				if tries, _ := intAttr(p, "handoff.publish.tries"); tries != int64(tt.failures)+1 {
					t.Errorf("publish tries %d, want %d", tries, tt.failures+1)
				}
				if retried := p.Status().Code == codes.Error; retried != (tt.failures > 0) {
					t.Errorf("publish status %v after %d failed tries", p.Status(), tt.failures)
				}
				if p.SpanKind() != trace.SpanKindProducer {
					t.Errorf("publish span of kind %s, want producer", p.SpanKind())
				}
			}
			if tt.attempts > 1 {
				// An attempt that never reached the app settles nothing.
				for _, s := range spans {
					if s.Parent().SpanID() == process[0].SpanContext().SpanID() {
						t.Errorf("%q under an attempt the app never took", s.Name())
					}
				}
			}
			if got := kinds(r.snapshot()); len(got) == 0 || got[len(got)-1] != tt.wantEvent {
				t.Errorf("events %v, want the last %s", got, tt.wantEvent)
			}
			ct.mu.Lock()
			defer ct.mu.Unlock()
			for _, s := range spans {
				if n := ct.ends[s.SpanContext().SpanID()]; n != 1 {
					t.Errorf("%q ended %d times", s.Name(), n)
				}
			}
		})
	}
}

// A shutdown ends the attempt's span and its publish's: during the call,
// and while a copy cannot be published.
func TestAttemptSpanEndsOnShutdown(t *testing.T) {
	tests := []struct {
		name  string
		setup func(r *rig)
		ready func(r *rig) bool
		spans []string
	}{
		{
			name:  "during the call",
			setup: func(r *rig) { r.app.delay = time.Minute },
			ready: func(r *rig) bool { return r.app.inFlight.Load() == 1 },
			spans: []string{"process "},
		},
		{
			name:  "while the copy cannot be published",
			setup: func(r *rig) { r.tr.fails.Store(1 << 20) },
			ready: func(r *rig) bool { return r.tr.fails.Load() <= 1<<20-2 }, // two tries failed
			spans: []string{"process ", "publish retry.1s"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, budget.Retry)
			tt.setup(r)
			e := r.engine(4, r.delivery("a"))
			rec, ct := traced(t, e)
			run(t, e, func() bool { return tt.ready(r) })
			spans := rec.Ended()
			for _, name := range tt.spans {
				got := named(spans, name)
				if len(got) != 1 {
					t.Fatalf("%d %q spans ended, want 1", len(got), name)
				}
				if got[0].Status().Code != codes.Error && name != "process " {
					t.Errorf("%q ended with status %v, want error", name, got[0].Status())
				}
			}
			if got := kinds(r.snapshot()); len(got) != 1 || got[0] != "release" {
				t.Errorf("events %v, want one release", got)
			}
			ct.mu.Lock()
			defer ct.mu.Unlock()
			for _, s := range spans {
				if n := ct.ends[s.SpanContext().SpanID()]; n != 1 {
					t.Errorf("%q ended %d times", s.Name(), n)
				}
			}
		})
	}
}

// With tracing off the spans of the walk cost nothing: no allocation, no
// context. With it on, work outside an attempt (a redelay, a copy published
// again after a crash) gets no span of its own.
func TestSpansOutsideAnAttempt(t *testing.T) {
	h := &handoff{e: &Engine{}, r: &Route{Name: "r"}, msg: &broker.Message{}}
	ctx := context.Background()
	req := &handler.Request{Attempt: 1}
	dest := broker.Destination{Tier: time.Second}
	if n := testing.AllocsPerRun(100, func() {
		actx, span := h.startAttempt(ctx, req)
		endCommit(h.startCommit(actx, 2), nil)
		pctx, pub := h.startPublish(actx, dest)
		endPublish(pub, 1, nil)
		endAttempt(span, handler.Result{Outcome: budget.Success})
		if actx != ctx || pctx != ctx {
			t.Fatal("a context was made with tracing off")
		}
	}); n != 0 {
		t.Errorf("%v allocations with tracing off, want 0", n)
	}

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h.e.o.Tracer = tp.Tracer("test")
	endCommit(h.startCommit(ctx, 1), nil)
	if pctx, pub := h.startPublish(ctx, dest); pub != nil || pctx != ctx {
		t.Error("a publish outside an attempt started a span")
	}
	if n := len(rec.Ended()); n != 0 {
		t.Errorf("%d spans outside an attempt, want none", n)
	}
}

// A message whose traceparent is missing, or present but invalid, starts its
// trace at its first attempt, and that attempt's context is what its copies
// carry; a valid one is the trace the attempts join, and copies keep it.
func TestRootTraceOfAMessageWithoutAValidParent(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	valid := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tt := range []struct {
		name, header string
		root         bool
	}{
		{"none", "", true},
		{"all-zero ids", "00-00000000000000000000000000000000-0000000000000000-01", true},
		{"malformed", "00-not-a-trace-01", true},
		{"valid", valid, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msg := &broker.Message{Headers: broker.Headers{}}
			if tt.header != "" {
				msg.Headers[headerTraceParent] = tt.header
			}
			h := &handoff{e: &Engine{o: Options{Tracer: tp.Tracer("test")}}, r: &Route{Name: "r"}, msg: msg}
			req := &handler.Request{Attempt: 1}
			_, span := h.startAttempt(context.Background(), req)
			span.End()
			if got := h.rootTrace != ""; got != tt.root {
				t.Fatalf("root trace recorded %v, want %v (header %q)", got, tt.root, tt.header)
			}
			if tt.root && h.rootTrace != req.TraceParent {
				t.Errorf("copies would carry %q, not the first attempt's %q", h.rootTrace, req.TraceParent)
			}
			if !tt.root && !strings.Contains(req.TraceParent, "4bf92f3577b34da6a3ce929d0e0e4736") {
				t.Errorf("attempt's traceparent %q left the message's trace", req.TraceParent)
			}
		})
	}
}
