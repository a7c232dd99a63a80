package handler

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
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
