package handler

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
)

// batchApp answers each event of a batch by its id.
func batchApp(t *testing.T, requests *atomic.Int32, got chan<- []map[string]any) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if ct := r.Header.Get("Content-Type"); ct != BatchContentType {
			t.Errorf("Content-Type = %q, want %q", ct, BatchContentType)
		}
		body, _ := io.ReadAll(r.Body)
		var events []map[string]any
		if err := json.Unmarshal(body, &events); err != nil {
			t.Errorf("batch body is not a JSON array of events: %v", err)
		}
		if got != nil {
			got <- events
		}
		var results []map[string]any
		for _, e := range events {
			id, _ := e["id"].(string)
			switch id {
			case "ok":
				results = append(results, map[string]any{"id": id, "outcome": "success"})
			case "busy":
				results = append(results, map[string]any{"id": id, "status": 503, "retry_after": 2})
			case "bad":
				results = append(results, map[string]any{"id": id, "status": 422, "detail": "bad sku"})
			case "later":
				results = append(results, map[string]any{"id": id, "outcome": "defer", "retry_after": "3"})
			case "missing":
			default:
				results = append(results, map[string]any{"id": id, "status": 200})
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
	}))
	t.Cleanup(srv.Close)
	return srv
}

func deliverAll(b *Batcher, reqs ...*Request) []Result {
	out := make([]Result, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = b.Deliver(context.Background(), r)
		}()
	}
	wg.Wait()
	return out
}

func attempt(id string, body []byte, contentType string) *Request {
	return &Request{Message: &broker.Message{Body: body, ContentType: contentType,
		Headers: broker.Headers{"ce_traceid": "t-1", "x-tenant": "acme", broker.HeaderAttempt: "9"}},
		EventID: id, Source: "urn:test", Type: "t", Attempt: 1, Timeout: 5 * time.Second}
}

func TestBatchEachMessageKeepsItsOwnOutcome(t *testing.T) {
	var requests atomic.Int32
	got := make(chan []map[string]any, 4)
	srv := batchApp(t, &requests, got)
	b := NewBatcher(newClient(t, srv.URL, 8), BatchOptions{MaxMessages: 5, MaxWait: time.Second})
	defer b.Close()
	res := deliverAll(b,
		attempt("ok", []byte(`{"sku":1}`), "application/json"),
		attempt("busy", []byte("raw bytes"), "application/octet-stream"),
		attempt("bad", nil, ""),
		attempt("later", nil, ""),
		attempt("missing", nil, ""))
	if n := requests.Load(); n != 1 {
		t.Fatalf("%d requests for 5 messages with max_messages 5, want 1", n)
	}
	want := []struct {
		o     budget.Outcome
		after time.Duration
	}{{budget.Success, 0}, {budget.Overload, 2 * time.Second}, {budget.Permanent, 0}, {budget.Defer, 3 * time.Second}, {budget.Unknown, 0}}
	for i, w := range want {
		if res[i].Outcome != w.o || res[i].RetryAfter != w.after {
			t.Errorf("message %d: %v after %v (%q), want %v after %v", i, res[i].Outcome, res[i].RetryAfter, res[i].Detail, w.o, w.after)
		}
	}
	if res[2].Detail != "bad sku" {
		t.Errorf("detail of the 422 = %q, want the app's", res[2].Detail)
	}
	events := <-got
	byID := map[string]map[string]any{}
	for _, e := range events {
		byID[e["id"].(string)] = e
	}
	ok, busy := byID["ok"], byID["busy"]
	if d, _ := json.Marshal(ok["data"]); string(d) != `{"sku":1}` || ok["datacontenttype"] != "application/json" {
		t.Errorf("JSON body not sent as data: %v", ok)
	}
	if raw, _ := base64.StdEncoding.DecodeString(busy["data_base64"].(string)); string(raw) != "raw bytes" {
		t.Errorf("binary body not sent as data_base64: %v", busy)
	}
	if ok["specversion"] != "1.0" || ok["source"] != "urn:test" || ok["handoffattempt"] != "1" || ok["traceid"] != "t-1" {
		t.Errorf("attributes = %v", ok)
	}
	if _, forged := ok["x-tenant"]; forged {
		t.Error("a header that is not a CloudEvents attribute became one")
	}
}

func TestBatchFillsThenWaits(t *testing.T) {
	var requests atomic.Int32
	srv := batchApp(t, &requests, nil)
	b := NewBatcher(newClient(t, srv.URL, 8), BatchOptions{MaxMessages: 2, MaxWait: 50 * time.Millisecond})
	defer b.Close()
	var reqs []*Request
	for range 5 {
		reqs = append(reqs, attempt("x", nil, ""))
	}
	start := time.Now()
	for _, r := range deliverAll(b, reqs...) {
		if r.Outcome != budget.Success {
			t.Errorf("outcome %v (%s)", r.Outcome, r.Detail)
		}
	}
	if n := requests.Load(); n < 3 || n > 5 {
		t.Errorf("%d requests for 5 messages of at most 2 a batch", n)
	}
	// Wide, for a loaded machine: a partial batch that waited for a full
	// one would never go.
	if time.Since(start) > 15*time.Second {
		t.Error("a partial batch waited far longer than max_wait")
	}
}

func TestBatchWholeAnswerAppliesToEveryMessage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		respond  func(w http.ResponseWriter)
		want     budget.Outcome
		requests int32
	}{
		{"503 for the batch", func(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) }, budget.Overload, 1},
		// Split until each stands alone, where each fails too.
		{"400 for the batch", func(w http.ResponseWriter) { w.WriteHeader(http.StatusBadRequest) }, budget.Permanent, 5},
		// The app does not speak the batch format: not split.
		{"unreadable answer", func(w http.ResponseWriter) { _, _ = w.Write([]byte("ok")) }, budget.Unknown, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var requests atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				tc.respond(w)
			}))
			defer srv.Close()
			b := NewBatcher(newClient(t, srv.URL, 8), BatchOptions{MaxMessages: 3, MaxWait: time.Minute})
			defer b.Close()
			for i, r := range deliverAll(b, attempt("a", nil, ""), attempt("b", nil, ""), attempt("c", nil, "")) {
				if r.Outcome != tc.want {
					t.Errorf("message %d: %v (%s), want %v", i, r.Outcome, r.Detail, tc.want)
				}
			}
			if n := requests.Load(); n != tc.requests {
				t.Errorf("%d requests, want %d", n, tc.requests)
			}
		})
	}
}

func TestBatchAppDownIsUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	b := NewBatcher(newClient(t, url, 8), BatchOptions{MaxMessages: 2, MaxWait: 10 * time.Millisecond})
	defer b.Close()
	if r := b.Deliver(context.Background(), attempt("a", nil, "")); r.Outcome != budget.Unreachable {
		t.Errorf("app down: %v (%s), want unreachable", r.Outcome, r.Detail)
	}
}

// Two attempts with one event id (from two sources, say) never share a batch:
// the app answers by id, and one answer must not settle both.
func TestBatchNeverHoldsAnEventIDTwice(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		var events []map[string]any
		_ = json.NewDecoder(r.Body).Decode(&events)
		var results []map[string]any
		for _, e := range events {
			status := 200
			if e["source"] == "urn:failing" {
				status = 503
			}
			results = append(results, map[string]any{"id": e["id"], "status": status})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
	}))
	t.Cleanup(srv.Close)
	b := NewBatcher(newClient(t, srv.URL, 8), BatchOptions{MaxMessages: 4, MaxWait: 100 * time.Millisecond})
	defer b.Close()
	failing, fine := attempt("o-1", nil, ""), attempt("o-1", nil, "")
	failing.Source = "urn:failing"
	res := deliverAll(b, failing, fine)
	if n := requests.Load(); n != 2 {
		t.Errorf("%d requests for two attempts of one event id, want 2", n)
	}
	if res[0].Outcome != budget.Overload || res[1].Outcome != budget.Success {
		t.Fatalf("outcomes %v and %v, want overload for the failing source and success for the other", res[0].Outcome, res[1].Outcome)
	}
}

// An answer that names an event twice is no answer for it.
func TestBatchResponseNamingAnEventTwiceIsUnknown(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"results":[{"id":"o-1","status":503},{"id":"o-1","status":200},{"id":"o-2","status":200}]}`)
	}))
	t.Cleanup(srv.Close)
	b := NewBatcher(newClient(t, srv.URL, 8), BatchOptions{MaxMessages: 2, MaxWait: 100 * time.Millisecond})
	defer b.Close()
	res := deliverAll(b, attempt("o-1", nil, ""), attempt("o-2", nil, ""))
	if res[0].Outcome != budget.Unknown || res[1].Outcome != budget.Success {
		t.Fatalf("outcomes %v (%s) and %v, want unknown and success", res[0].Outcome, res[0].Detail, res[1].Outcome)
	}
}

// Results are matched by id, whatever their order; an event the answer
// leaves out is unknown.
func TestBatchResponseInAnotherOrder(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"results":[{"id":"o-3","status":422},{"id":"o-1","status":503}]}`)
	}))
	t.Cleanup(srv.Close)
	b := NewBatcher(newClient(t, srv.URL, 8), BatchOptions{MaxMessages: 3, MaxWait: 100 * time.Millisecond})
	defer b.Close()
	res := deliverAll(b, attempt("o-1", nil, ""), attempt("o-2", nil, ""), attempt("o-3", nil, ""))
	if res[0].Outcome != budget.Overload || res[1].Outcome != budget.Unknown || res[2].Outcome != budget.Permanent {
		t.Fatalf("outcomes %v, %v (%s), %v; want overload, unknown and permanent", res[0].Outcome, res[1].Outcome, res[1].Detail, res[2].Outcome)
	}
}

// TestEncodeBatchAttributes: every event of a batch is one JSON object with
// each attribute once: the sidecar's own attributes win over a message
// header of the same name, two spellings of one extension send one value
// (the same on every attempt), and JSON data is copied as it is.
func TestEncodeBatchAttributes(t *testing.T) {
	r := &Request{
		Message: &broker.Message{ContentType: "application/json", Body: []byte("{\"a\": [1,\n 2]}"), Headers: broker.Headers{
			"ce-handoffattempt": "99", "ce_id": "forged", "ce-data": "x",
			"ce-tenant": "b", "ce_tenant": "a", "cloudEvents:Tenant": "c", "ce-traceparent": "00-1-2-01",
		}},
		EventID: "e-1", Source: "/s", Type: "t", Attempt: 3, Deadline: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	var first []byte
	for range 20 { // header order is map order: every encoding must agree
		body := encodeBatch([]*Request{r, {Message: &broker.Message{Body: []byte{0, 1, 2}}, EventID: "e-2"}})
		if first == nil {
			first = body
		} else if !bytes.Equal(body, first) {
			t.Fatalf("two encodings of one batch differ:\n%s\n%s", first, body)
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		var events []json.RawMessage
		if err := dec.Decode(&events); err != nil || len(events) != 2 {
			t.Fatalf("batch %s: %v", body, err)
		}
		keys := map[string]int{}
		d := json.NewDecoder(bytes.NewReader(events[0]))
		d.Token() // {
		for d.More() {
			k, _ := d.Token()
			keys[k.(string)]++
			var v json.RawMessage
			if err := d.Decode(&v); err != nil {
				t.Fatal(err)
			}
		}
		for k, n := range keys {
			if n != 1 {
				t.Errorf("attribute %q written %d times in %s", k, n, events[0])
			}
		}
		var e map[string]any
		_ = json.Unmarshal(events[0], &e)
		if e["handoffattempt"] != "3" || e["id"] != "e-1" || e["tenant"] != "a" || e["traceparent"] != "00-1-2-01" {
			t.Errorf("event attributes: %v", e)
		}
		if !bytes.Contains(events[0], []byte("\"data\":{\"a\": [1,\n 2]}")) {
			t.Errorf("JSON data not copied as it is: %s", events[0])
		}
		var bin map[string]any
		_ = json.Unmarshal(events[1], &bin)
		if bin["data_base64"] != "AAEC" || bin["data"] != nil {
			t.Errorf("binary event: %v", bin)
		}
	}
}

// Re-attempts never share a batch with first attempts, and their batches
// halve with each attempt.
func TestBatchReattemptsGoInSmallerBatches(t *testing.T) {
	app, srv := newPoisonApp(t, func([]string) int { return 0 })
	b := NewBatcher(newClient(t, srv.URL, 32), BatchOptions{MaxMessages: 8, MaxWait: 20 * time.Millisecond})
	defer b.Close()
	var reqs []*Request
	attempts := map[string]int{}
	for i, n := range []int{1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 9} {
		r := attempt(fmt.Sprintf("a%d-%d", n, i), nil, "")
		r.Attempt = n
		attempts[r.EventID] = n
		reqs = append(reqs, r)
	}
	for _, r := range deliverAll(b, reqs...) {
		if r.Outcome != budget.Success {
			t.Errorf("%v (%s)", r.Outcome, r.Detail)
		}
	}
	limit := map[int]int{1: 8, 2: 4, 3: 2, 4: 1, 9: 1}
	for _, ids := range app.requests {
		n := attempts[ids[0]]
		for _, id := range ids {
			if limit[attempts[id]] != limit[n] {
				t.Errorf("attempts %d and %d share a batch: %v", n, attempts[id], ids)
			}
		}
		if len(ids) > limit[n] {
			t.Errorf("%d attempts of number %d in one batch, want at most %d: %v", len(ids), n, limit[n], ids)
		}
	}
}

// Close waits for the batches in flight: once it returns, the app has
// answered every attempt the batcher took.
func TestBatchCloseWaitsForBatchesInFlight(t *testing.T) {
	got, release := make(chan struct{}), make(chan struct{})
	var answered atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(got)
		<-release
		answered.Store(true)
		_, _ = io.WriteString(w, `{"results":[{"id":"a","status":200}]}`)
	}))
	defer srv.Close()
	b := NewBatcher(newClient(t, srv.URL, 1), BatchOptions{MaxMessages: 1})
	res := make(chan Result, 1)
	go func() { res <- b.Deliver(context.Background(), attempt("a", nil, "")) }()
	<-got
	closed := make(chan struct{})
	go func() {
		b.Close()
		close(closed)
	}()
	close(release)
	<-closed
	if !answered.Load() {
		t.Error("Close returned before the batch in flight had its answer")
	}
	if r := <-res; r.Outcome != budget.Success {
		t.Errorf("%v (%s)", r.Outcome, r.Detail)
	}
	b.Close() // twice is fine
}

// A request nobody waits for any more is cancelled, not left to run out its
// timeout.
func TestBatchCallCancelledWhenNobodyWaits(t *testing.T) {
	got, cancelled := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a closed connection only after the body
		close(got)
		<-r.Context().Done()
		close(cancelled)
	}))
	defer srv.Close()
	b := NewBatcher(newClient(t, srv.URL, 2), BatchOptions{MaxMessages: 2, MaxWait: 10 * time.Millisecond})
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	r := attempt("a", nil, "")
	r.Timeout = time.Hour
	done := make(chan Result)
	go func() { done <- b.Deliver(ctx, r) }()
	<-got
	cancel()
	if res := <-done; res.Outcome != budget.Unknown {
		t.Errorf("cancelled: %v, want unknown", res.Outcome)
	}
	<-cancelled
}

// Event ids that are not UTF-8 reach the app with U+FFFD in place of their
// bad bytes, in JSON and in protobuf alike: the batch matches the app's
// answer on that spelling, and two ids that differ only in bad bytes never
// share a batch, where one answer would settle both.
func TestBatchIDsAsTheWireCarriesThem(t *testing.T) {
	app, srv := newPoisonApp(t, func([]string) int { return 0 })
	b := NewBatcher(newClient(t, srv.URL, 4), BatchOptions{MaxMessages: 4, MaxWait: 50 * time.Millisecond})
	defer b.Close()
	reqs := []*Request{attempt("id\xff", nil, ""), attempt("id\xfe", nil, ""), attempt("ok", nil, "")}
	res := deliverAll(b, reqs...)
	for i, r := range res {
		if r.Outcome != budget.Success {
			t.Errorf("%q: %v (%s), want success", reqs[i].EventID, r.Outcome, r.Detail)
		}
	}
	app.mu.Lock()
	defer app.mu.Unlock()
	for _, ids := range app.requests {
		n := 0
		for _, id := range ids {
			if id == "id\uFFFD" {
				n++
			}
		}
		if n > 1 {
			t.Errorf("one request carried %d events the app knows as %q: %v", n, "id\uFFFD", app.requests)
		}
	}
	if len(app.requests) < 2 {
		t.Errorf("%d requests, want at least 2: the two ids alike on the wire cannot share one", len(app.requests))
	}
}
