package handler

import (
	"net/http"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// checkHeaderCap fails when setHeaders sets more headers for r than
// headerCap said, which would grow the map Deliver made for them.
func checkHeaderCap(t *testing.T, r *Request) {
	t.Helper()
	h := http.Header{}
	setHeaders(h, r)
	if c := headerCap(r); len(h) > c {
		t.Errorf("setHeaders set %d headers, headerCap said at most %d: %v", len(h), c, h)
	}
}

func TestHeaderCapBoundsSetHeaders(t *testing.T) {
	deadline := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ev, err := broker.ParseStructured([]byte(`{"specversion":"1.0","id":"a","source":"/s","type":"t","tenant":"x","region":"eu","data":{"x":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		r    Request
	}{
		{"bare", Request{Message: &broker.Message{}}},
		{"every attempt field", Request{
			Message:  &broker.Message{ContentType: "application/json"},
			Deadline: deadline, ReplayID: "rp-1", TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", TraceState: "a=b",
		}},
		{"content type from a header", Request{Message: &broker.Message{Headers: broker.Headers{"ce_datacontenttype": "text/plain"}}}},
		{"attributes and headers", Request{Message: &broker.Message{Headers: broker.Headers{
			"ce_source": "/o", "ce_type": "t", "ce_id": "x", "ce-tenant": "b", "ce_tenant": "a", "x-a": "2", "X-A": "1",
			"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "c=d", "handoff-attempt": "9",
		}}, TraceParent: "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"}},
		{"structured event", Request{Message: &broker.Message{ContentType: broker.StructuredContentType, Event: ev, Headers: broker.Headers{"x-b": "1", "ce_tenant": "y"}}, Deadline: deadline}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.r
			r.EventID, r.Source, r.Type, r.Attempt = "evt", "/src", "typ", 2
			checkHeaderCap(t, &r)
		})
	}
}

// The call that makes up most traffic, a message with a header or two and no
// trace context, fits the one-group map.
func TestHeaderCapOfAPlainMessage(t *testing.T) {
	r := &Request{
		Message: &broker.Message{Headers: broker.Headers{"ce_id": "e"}},
		EventID: "evt", Source: "/src", Type: "typ", Attempt: 1, Deadline: time.Now(),
	}
	if c := headerCap(r); c > 8 {
		t.Errorf("headerCap = %d, want at most 8", c)
	}
}

func FuzzHeaderCap(f *testing.F) {
	f.Add("ce_type", "t", "X-A", "1", "application/json", true, true)
	f.Add("ce-x", "b", "ce_x", "a", "", false, true)
	f.Add("ce_datacontenttype", "text/plain", "tracestate", "a=b", "", true, false)
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, contentType string, deadline, trace bool) {
		r := &Request{
			Message: &broker.Message{ContentType: contentType, Headers: broker.Headers{k1: v1, k2: v2}},
			EventID: "evt", Source: "src", Type: "typ", Attempt: 1,
		}
		if deadline {
			r.Deadline = time.Unix(1, 0)
		}
		if trace {
			r.TraceParent, r.TraceState = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "a=b"
		}
		checkHeaderCap(t, r)
	})
}
