package handler

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
)

// BenchmarkSetHeaders builds the headers of one attempt, as every call does:
// CloudEvents attributes, Handoff-* headers and two message headers.
func BenchmarkSetHeaders(b *testing.B) {
	r := &Request{
		Message: &broker.Message{ContentType: "application/json", Headers: broker.Headers{
			"tenant": "a", "ce_type": "com.example.order.created",
		}},
		EventID: "order-1234", Source: "/handoff/orders", Type: "com.example.fallback",
		Attempt: 1, Deadline: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	b.ReportAllocs()
	for b.Loop() {
		h := make(http.Header, 12)
		setHeaders(h, r)
	}
}

// BenchmarkResponse maps an answer to an outcome, as every call does.
func BenchmarkResponse(b *testing.B) {
	c, err := NewClassifier(nil)
	if err != nil {
		b.Fatal(err)
	}
	h := http.Header{"Content-Length": {"0"}}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		if o, _ := c.Response(503, h, now); o == 0 {
			b.Fatal("no outcome")
		}
	}
}

// BenchmarkEncodeBatch encodes a batch of 64 events with 1 KiB bodies, half
// JSON (sent as data) and half not (sent as data_base64).
func BenchmarkEncodeBatch(b *testing.B) {
	reqs := make([]*Request, 64)
	size := 0
	for i := range reqs {
		body := []byte(`{"id":"` + strings.Repeat("x", 1000) + `"}`)
		ct := "application/json"
		if i%2 == 1 {
			ct = ""
		}
		size += len(body)
		reqs[i] = &Request{
			Message: &broker.Message{ContentType: ct, Body: body, Headers: broker.Headers{"ce_traceparent": "00-abc-def-01"}},
			EventID: "order-" + strconv.Itoa(i), Source: "/handoff/orders", Type: "com.example.order",
			Attempt: 1, Deadline: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		}
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encodeBatch(reqs); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDeliver makes single-message attempts against an app on
// loopback that answers at once, 64 at a time, as the sidecar does.
func BenchmarkDeliver(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer srv.Close()
	h, err := NewHTTP(HTTPOptions{URL: srv.URL, MaxConcurrency: 64, Classifier: mustClassifier(b, nil)})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	body := []byte(strings.Repeat("x", 1024))
	b.SetParallelism(32)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := &Request{
				Message: &broker.Message{Body: body, Headers: broker.Headers{"ce_id": "e"}},
				EventID: "6f1c2b1e-8a3d-4c1e-9f0a-1b2c3d4e5f60", Source: "/handoff/orders", Type: "handoff.message",
				Attempt: 1, Deadline: time.Now().Add(time.Minute), Timeout: 10 * time.Second,
			}
			if res := h.Deliver(b.Context(), r); res.Outcome != budget.Success {
				b.Fatal(res.Detail)
			}
		}
	})
}
