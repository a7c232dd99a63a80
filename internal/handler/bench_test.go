package handler

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
)

// BenchmarkSetHeaders builds the headers of one attempt, as every call does
// (into a pooled call's state): CloudEvents attributes, Handoff-* headers
// and two message headers.
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
		c := getCallState()
		appendHeaders(&c.header, r)
		putCallState(c)
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
		encodeBatch(reqs)
	}
}

// BenchmarkDeliver makes single-message attempts, 64 at a time as the
// sidecar does, against an app on loopback (in a process of its own) that
// answers at once: handoff through Deliver, net-http through a plain
// http.Client posting the same body with the same headers, as a consumer
// written by hand would. cpu-ns/op is the process's CPU (rusage) per call,
// syscw/op and syscr/op its write and read system calls per call.
func BenchmarkDeliver(b *testing.B) {
	url := startBenchApp(b)
	body := []byte(strings.Repeat("x", 1024))
	msg := &broker.Message{Body: body, Headers: broker.Headers{"ce_id": "e"}}
	const (
		eventID = "6f1c2b1e-8a3d-4c1e-9f0a-1b2c3d4e5f60"
		source  = "/handoff/orders"
		typ     = "handoff.message"
	)
	b.Run("handoff", func(b *testing.B) {
		h, err := NewHTTP(HTTPOptions{URL: url, MaxConcurrency: 64, Classifier: mustClassifier(b, nil)})
		if err != nil {
			b.Fatal(err)
		}
		defer h.Close()
		runParallel(b, func() func() {
			// The attempt is built by the caller, once per attempt
			// whatever the transport: its cost is not the call's.
			r := &Request{Message: msg, EventID: eventID, Source: source, Type: typ, Attempt: 1, Timeout: 10 * time.Second}
			return func() {
				r.Deadline = time.Now().Add(time.Minute)
				if res := h.Deliver(b.Context(), r); res.Outcome != budget.Success {
					b.Fatal(res.Detail)
				}
			}
		})
	})
	b.Run("net-http", func(b *testing.B) {
		tr := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr}
		runParallel(b, func() func() {
			return func() {
				req, err := http.NewRequestWithContext(b.Context(), http.MethodPost, url, bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				req.Header.Set("Ce-Id", eventID)
				req.Header.Set("Ce-Specversion", SpecVersion)
				req.Header.Set("Ce-Source", source)
				req.Header.Set("Ce-Type", typ)
				req.Header.Set("Handoff-Attempt", strconv.Itoa(1))
				req.Header.Set("Handoff-Deadline", time.Now().Add(time.Minute).UTC().Format(broker.TimeLayout))
				req.Header.Set("Handoff-Redelivered", strconv.FormatBool(false))
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode/100 != 2 {
					b.Fatal(resp.Status)
				}
			}
		})
	})
}

// runParallel runs the calls that each worker's setup returns, 64 workers
// on the 2 cores the project's machines have (32 per GOMAXPROCS), and
// reports their cost.
func runParallel(b *testing.B, worker func() func()) {
	b.SetParallelism(32)
	b.ReportAllocs()
	before := readUsage(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		call := worker()
		for pb.Next() {
			call()
		}
	})
	b.StopTimer()
	reportUsage(b, before)
}
