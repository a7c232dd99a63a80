package handler

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
)

const (
	spanParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	msgParent  = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
)

func TestEventTrace(t *testing.T) {
	tests := []struct {
		name               string
		parent, state      string // the attempt's span
		headers            broker.Headers
		wantParent, wantSt string
		wantOK             bool
	}{
		{name: "the attempt's span wins", parent: spanParent, state: "span=1",
			headers:    broker.Headers{"traceparent": msgParent, "tracestate": "msg=1"},
			wantParent: spanParent, wantSt: "span=1", wantOK: true},
		{name: "a span without tracestate does not take the message's", parent: spanParent,
			headers:    broker.Headers{"traceparent": msgParent, "tracestate": "msg=1"},
			wantParent: spanParent, wantOK: true},
		{name: "no span: the message's header", headers: broker.Headers{"traceparent": msgParent, "tracestate": "msg=1"},
			wantParent: msgParent, wantSt: "msg=1", wantOK: true},
		{name: "header names are case-insensitive", headers: broker.Headers{"Traceparent": msgParent, "TraceState": "msg=1"},
			wantParent: msgParent, wantSt: "msg=1", wantOK: true},
		{name: "two spellings: the smaller valid value",
			headers:    broker.Headers{"traceparent": msgParent, "Traceparent": spanParent, "TRACEPARENT": "00-zz"},
			wantParent: msgParent, wantOK: true},
		{name: "an invalid tracestate is left out", headers: broker.Headers{"traceparent": msgParent, "tracestate": "msg=1\n"},
			wantParent: msgParent, wantOK: true},
		{name: "an invalid traceparent is none", headers: broker.Headers{"traceparent": "00-1-2-01", "tracestate": "msg=1"}},
		{name: "a tracestate alone is none", headers: broker.Headers{"tracestate": "msg=1"}},
		{name: "a CloudEvents attribute is not a header", headers: broker.Headers{"ce-traceparent": msgParent}},
		{name: "nothing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Request{Message: &broker.Message{Headers: tt.headers}, TraceParent: tt.parent, TraceState: tt.state}
			for range 10 { // header order is map order: every call must agree
				parent, state, ok := eventTrace(r)
				if parent != tt.wantParent || state != tt.wantSt || ok != tt.wantOK {
					t.Fatalf("eventTrace = %q, %q, %v; want %q, %q, %v", parent, state, ok, tt.wantParent, tt.wantSt, tt.wantOK)
				}
			}
		})
	}
}

func TestValidTraceParent(t *testing.T) {
	tests := []struct {
		name string
		v    string
		want bool
	}{
		{"version 00", msgParent, true},
		{"unsampled", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", true},
		{"a later version with more fields", "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what", true},
		{"a later version, as long as 00", "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", true},
		{"version 00 with more fields", msgParent + "-what", false},
		{"version ff", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", false},
		{"upper-case hex", "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", false},
		{"zero trace id", "00-00000000000000000000000000000000-b7ad6b7169203331-01", false},
		{"zero span id", "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", false},
		{"short", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71692033-01", false},
		{"a later version joined without a dash", "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x", false},
		{"not hex", "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01", false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := validTraceParent(tt.v); got != tt.want {
				t.Errorf("validTraceParent(%q) = %v, want %v", tt.v, got, tt.want)
			}
		})
	}
}

// traceBatch is a batch of attempts, each with the trace context its event
// must carry ("" for none).
func traceBatch() (reqs []*Request, want map[string][2]string) {
	req := func(id string, h broker.Headers) *Request {
		return &Request{Message: &broker.Message{Body: []byte("{}"), ContentType: "application/json", Headers: h},
			EventID: id, Source: "urn:test", Type: "t", Attempt: 1, Timeout: 5 * time.Second}
	}
	spanned := req("spanned", broker.Headers{"traceparent": msgParent, "tracestate": "msg=1", "ce-tracestate": "attr=1"})
	spanned.TraceParent, spanned.TraceState = spanParent, "span=1"
	reqs = []*Request{
		spanned,
		req("headered", broker.Headers{"traceparent": msgParent, "tracestate": "msg=1"}),
		// The message's own CloudEvents attribute stays when there is no
		// trace context to put in its place.
		req("attributed", broker.Headers{"ce-traceparent": "00-1-2-01"}),
		req("plain", broker.Headers{"x-tenant": "acme"}),
	}
	want = map[string][2]string{
		"spanned":    {spanParent, "span=1"},
		"headered":   {msgParent, "msg=1"},
		"attributed": {"00-1-2-01", ""},
		"plain":      {"", ""},
	}
	return reqs, want
}

// A batch has no per-event headers or metadata: each event carries its own
// attempt's trace context as its traceparent and tracestate extensions.
func TestBatchEventsCarryTheirOwnTraceContext(t *testing.T) {
	reqs, want := traceBatch()
	check := func(t *testing.T, got map[string][2]string) {
		t.Helper()
		for id, w := range want {
			if g, ok := got[id]; !ok || g != w {
				t.Errorf("%s: event carries traceparent %q, tracestate %q; want %q, %q", id, g[0], g[1], w[0], w[1])
			}
		}
	}
	t.Run("http", func(t *testing.T) {
		var requests atomic.Int32
		events := make(chan []map[string]any, 1)
		srv := batchApp(t, &requests, events)
		b := NewBatcher(newClient(t, srv.URL, 8), BatchOptions{MaxMessages: len(reqs), MaxWait: time.Minute})
		defer b.Close()
		for i, res := range deliverAll(b, reqs...) {
			if res.Outcome != budget.Success {
				t.Fatalf("%s: %v (%s)", reqs[i].EventID, res.Outcome, res.Detail)
			}
		}
		if n := requests.Load(); n != 1 {
			t.Fatalf("%d requests, want the %d attempts in one batch", n, len(reqs))
		}
		got := map[string][2]string{}
		for _, e := range <-events {
			parent, _ := e["traceparent"].(string)
			state, _ := e["tracestate"].(string)
			got[e["id"].(string)] = [2]string{parent, state}
		}
		check(t, got)
	})
	t.Run("grpc", func(t *testing.T) {
		var mu sync.Mutex
		got := map[string][2]string{}
		a := &grpcApp{}
		a.batch = func(_ context.Context, r *handlerv1.HandleBatchRequest) (*handlerv1.HandleBatchResponse, error) {
			out := &handlerv1.HandleBatchResponse{}
			mu.Lock()
			defer mu.Unlock()
			for _, q := range r.GetRequests() {
				ev := q.GetEvent()
				got[ev.GetId()] = [2]string{ev.GetExtensions()["traceparent"], ev.GetExtensions()["tracestate"]}
				out.Results = append(out.Results, &handlerv1.HandleResult{Id: ev.GetId()})
			}
			return out, nil
		}
		b := NewBatcher(newGRPCClient(t, serveGRPC(t, a, "tcp"), nil), BatchOptions{MaxMessages: len(reqs), MaxWait: time.Minute})
		defer b.Close()
		for i, res := range deliverAll(b, reqs...) {
			if res.Outcome != budget.Success {
				t.Fatalf("%s: %v (%s)", reqs[i].EventID, res.Outcome, res.Detail)
			}
		}
		a.mu.Lock()
		batches := len(a.batches)
		a.mu.Unlock()
		if batches != 1 {
			t.Fatalf("%d HandleBatch calls, want the %d attempts in one", batches, len(reqs))
		}
		mu.Lock()
		defer mu.Unlock()
		check(t, got)
	})
}

// The trace context is the only attempt-specific extension: every attempt
// of one message, given the same span, sends the same bytes, with the
// extensions in name order.
func TestBatchTraceContextKeepsEncodingDeterministic(t *testing.T) {
	r := &Request{Message: &broker.Message{Body: []byte{1}, Headers: broker.Headers{
		"ce-zeta": "z", "ce-alpha": "a", "ce-tracestate": "attr=1", "Traceparent": msgParent, "tracestate": "msg=1",
	}}, EventID: "e-1", Attempt: 2}
	var first []byte
	for range 20 {
		body := encodeBatch([]*Request{r})
		if first == nil {
			first = body
			continue
		}
		if string(body) != string(first) {
			t.Fatalf("two encodings of one attempt differ:\n%s\n%s", first, body)
		}
	}
	want := `"alpha":"a","traceparent":"` + msgParent + `","tracestate":"msg=1","zeta":"z"`
	if !strings.Contains(string(first), want) {
		t.Errorf("extensions not in name order, or the message's attribute tracestate kept: %s", first)
	}
}
