package handler

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
)

// seen is what the app observed of one request.
type seen struct {
	method        string
	host          string
	header        http.Header
	body          []byte
	contentLength int64
	chunked       bool
}

// recordingApp starts a loopback app that records every request it receives
// and answers with respond. The returned channel holds the recordings.
func recordingApp(t *testing.T, respond http.HandlerFunc) (*httptest.Server, <-chan seen) {
	t.Helper()
	ch := make(chan seen, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("app: read body: %v", err)
		}
		ch <- seen{
			method:        r.Method,
			host:          r.Host,
			header:        r.Header.Clone(),
			body:          body,
			contentLength: r.ContentLength,
			chunked:       len(r.TransferEncoding) > 0,
		}
		if respond != nil {
			respond(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, ch
}

// newClient returns an HTTP client for url with the default classifier.
func newClient(t *testing.T, url string, maxConcurrency int) *HTTP {
	t.Helper()
	h, err := NewHTTP(HTTPOptions{URL: url, MaxConcurrency: maxConcurrency, Classifier: mustClassifier(t, nil)})
	if err != nil {
		t.Fatalf("NewHTTP(%q): %v", url, err)
	}
	t.Cleanup(h.Close)
	return h
}

// request returns a minimal attempt for msg.
func request(msg *broker.Message) *Request {
	return &Request{
		Message: msg,
		EventID: "evt-1",
		Source:  "urn:handoff:test",
		Type:    "com.example.fallback",
		Attempt: 1,
		Timeout: 5 * time.Second,
	}
}

// one returns the single request the app recorded.
func one(t *testing.T, ch <-chan seen) seen {
	t.Helper()
	select {
	case s := <-ch:
		return s
	default:
		t.Fatal("the app received no request")
		return seen{}
	}
}

func TestNewHTTPProbeAddress(t *testing.T) {
	tests := []struct {
		name string
		url  string
		want string
	}{
		{"explicit port", "http://127.0.0.1:8080/events", "127.0.0.1:8080"},
		{"http default port", "http://localhost/events", "localhost:80"},
		{"https default port", "https://app.internal/", "app.internal:443"},
		{"ipv6 with port", "http://[::1]:9000/", "[::1]:9000"},
		{"ipv6 default port", "http://[::1]/", "[::1]:80"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newClient(t, tt.url, 1)
			if h.addr != tt.want {
				t.Errorf("probe address = %q, want %q", h.addr, tt.want)
			}
		})
	}
}

func TestNewHTTPInvalidURL(t *testing.T) {
	tests := []struct {
		name string
		url  string
	}{
		{"unclosed ipv6 bracket", "http://[::1/"},
		{"missing scheme", "://app"},
		{"control character", "http://app/\x7f"},
		{"bad port", "http://app:port/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := NewHTTP(HTTPOptions{URL: tt.url, MaxConcurrency: 1, Classifier: mustClassifier(t, nil)})
			if err == nil {
				h.Close()
				t.Fatalf("NewHTTP(%q) succeeded, want an error", tt.url)
			}
		})
	}
}

func TestDeliverRequestBody(t *testing.T) {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	tests := []struct {
		name        string
		body        []byte
		contentType string
	}{
		{"json", []byte(`{"order":42,"note":"ünïcødé"}`), "application/json"},
		{"every byte value", binary, "application/octet-stream"},
		{"empty body", nil, ""},
		{"crlf and nul inside", []byte("line1\r\nline2\x00\r\n\r\n"), "text/plain; charset=utf-8"},
		{"large body", bytes.Repeat([]byte("0123456789abcdef"), 64<<10), "application/x-protobuf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, ch := recordingApp(t, nil)
			h := newClient(t, srv.URL+"/events", 1)
			res := h.Deliver(context.Background(), request(&broker.Message{Body: tt.body, ContentType: tt.contentType}))
			if res.Outcome != budget.Success || res.Status != http.StatusOK {
				t.Fatalf("result = %+v, want success 200", res)
			}
			s := one(t, ch)
			if s.method != http.MethodPost {
				t.Errorf("method = %q, want POST", s.method)
			}
			if !bytes.Equal(s.body, tt.body) {
				t.Errorf("body differs: got %d bytes, want %d", len(s.body), len(tt.body))
			}
			if s.contentLength != int64(len(tt.body)) || s.chunked {
				t.Errorf("content-length = %d chunked = %v, want %d unchunked", s.contentLength, s.chunked, len(tt.body))
			}
			if got := s.header.Values("Content-Type"); tt.contentType == "" && len(got) != 0 {
				t.Errorf("Content-Type = %q, want none", got)
			} else if tt.contentType != "" && (len(got) != 1 || got[0] != tt.contentType) {
				t.Errorf("Content-Type = %q, want %q", got, tt.contentType)
			}
		})
	}
}

func TestDeliverResult(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		header     map[string]string
		body       string
		want       budget.Outcome
		wantAfter  time.Duration
		wantDetail string
	}{
		{name: "200", status: 200, body: "fine", want: budget.Success},
		{name: "201", status: 201, want: budget.Success},
		{name: "204", status: 204, want: budget.Success},
		{name: "400 with evidence", status: 400, body: `{"error":"missing field id"}`, want: budget.Permanent, wantDetail: `HTTP 400: {"error":"missing field id"}`},
		{name: "404 without a body", status: 404, want: budget.Permanent, wantDetail: "HTTP 404"},
		{name: "409", status: 409, body: "order 7 not seen yet", want: budget.Defer, wantDetail: "HTTP 409: order 7 not seen yet"},
		{name: "410", status: 410, body: "gone", want: budget.Drop, wantDetail: "HTTP 410: gone"},
		{name: "429 with retry-after", status: 429, header: map[string]string{"Retry-After": "3"}, body: "slow down", want: budget.Overload, wantAfter: 3 * time.Second, wantDetail: "HTTP 429: slow down"},
		{name: "503 with huge retry-after", status: 503, header: map[string]string{"Retry-After": "999999"}, want: budget.Overload, wantAfter: 24 * time.Hour, wantDetail: "HTTP 503"},
		{name: "500 evidence is trimmed", status: 500, body: "\n  boom: db down \n\n", want: budget.Retry, wantDetail: "HTTP 500: boom: db down"},
		{name: "502", status: 502, body: "bad gateway", want: budget.Retry, wantDetail: "HTTP 502: bad gateway"},
		{name: "declared dead-letter on 200", status: 200, header: map[string]string{"Handoff-Outcome": "dead-letter"}, body: "cannot parse", want: budget.Permanent, wantDetail: "HTTP 200"},
		{name: "declared success on 500", status: 500, header: map[string]string{"Handoff-Outcome": "Success"}, body: "recorded rejection", want: budget.Success},
		{name: "declared retry with retry-after", status: 202, header: map[string]string{"Handoff-Outcome": " RETRY ", "Retry-After": "12"}, want: budget.Retry, wantAfter: 12 * time.Second, wantDetail: "HTTP 202"},
		{name: "declared drop on 422", status: 422, header: map[string]string{"Handoff-Outcome": "drop"}, body: "duplicate", want: budget.Drop, wantDetail: "HTTP 422: duplicate"},
		{name: "unknown declared outcome ignored", status: 200, header: map[string]string{"Handoff-Outcome": "whatever"}, want: budget.Success},
		{name: "unreachable cannot be declared", status: 500, header: map[string]string{"Handoff-Outcome": "unreachable"}, body: "x", want: budget.Retry, wantDetail: "HTTP 500: x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := recordingApp(t, func(w http.ResponseWriter, _ *http.Request) {
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			h := newClient(t, srv.URL, 1)
			res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")}))
			if res.Outcome != tt.want {
				t.Errorf("Outcome = %v, want %v", res.Outcome, tt.want)
			}
			if res.Status != tt.status {
				t.Errorf("Status = %d, want %d", res.Status, tt.status)
			}
			if res.RetryAfter != tt.wantAfter {
				t.Errorf("RetryAfter = %v, want %v", res.RetryAfter, tt.wantAfter)
			}
			if res.Detail != tt.wantDetail {
				t.Errorf("Detail = %q, want %q", res.Detail, tt.wantDetail)
			}
			if res.Latency <= 0 {
				t.Errorf("Latency = %v, want > 0", res.Latency)
			}
		})
	}
}

// TestDeliverDoesNotFollowRedirects: DESIGN §4 maps 3xx to PERMANENT (the
// handler URL is wrong). Following the redirect instead would turn the POST
// into a body-less GET for 301/302/303 and report whatever that answers.
func TestDeliverDoesNotFollowRedirects(t *testing.T) {
	tests := []struct {
		name   string
		status int
	}{
		{"301 moved permanently", http.StatusMovedPermanently},
		{"302 found", http.StatusFound},
		{"303 see other", http.StatusSeeOther},
		{"307 temporary redirect", http.StatusTemporaryRedirect},
		{"308 permanent redirect", http.StatusPermanentRedirect},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				followed atomic.Int64
				mu       sync.Mutex
				got      string // how the followed request looked
			)
			mux := http.NewServeMux()
			mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "/moved", tt.status)
			})
			mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) {
				followed.Add(1)
				body, _ := io.ReadAll(r.Body)
				mu.Lock()
				got = r.Method + " with body " + strconv.Quote(string(body))
				mu.Unlock()
				w.WriteHeader(http.StatusOK)
			})
			srv := httptest.NewServer(mux)
			defer srv.Close()
			h := newClient(t, srv.URL+"/events", 1)
			res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte(`{"id":1}`)}))
			if res.Outcome != budget.Permanent || res.Status != tt.status {
				t.Errorf("Outcome, Status = %v, %d; want permanent, %d (detail %q)", res.Outcome, res.Status, tt.status, res.Detail)
			}
			if !strings.HasPrefix(res.Detail, "HTTP "+strconv.Itoa(tt.status)) {
				t.Errorf("Detail = %q, want it to start with HTTP %d", res.Detail, tt.status)
			}
			if n := followed.Load(); n != 0 {
				mu.Lock()
				defer mu.Unlock()
				t.Errorf("the redirect target was called %d times (last: %s), want 0", n, got)
			}
		})
	}
}

func TestDeliverUsesClassifierOverrides(t *testing.T) {
	tests := []struct {
		name      string
		overrides map[string]string
		status    int
		want      budget.Outcome
	}{
		{"exact override", map[string]string{"404": "retry"}, 404, budget.Retry},
		{"class override", map[string]string{"5xx": "permanent"}, 503, budget.Permanent},
		{"exact wins over class", map[string]string{"5xx": "permanent", "503": "overload"}, 503, budget.Overload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := recordingApp(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(tt.status) })
			h, err := NewHTTP(HTTPOptions{URL: srv.URL, MaxConcurrency: 1, Classifier: mustClassifier(t, tt.overrides)})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			if res := h.Deliver(context.Background(), request(&broker.Message{})); res.Outcome != tt.want {
				t.Errorf("Outcome = %v, want %v (result %+v)", res.Outcome, tt.want, res)
			}
		})
	}
}

func TestDeliverEvidenceIsBounded(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"just under the limit", 500, strings.Repeat("a", 255), "HTTP 500: " + strings.Repeat("a", 255)},
		{"exactly the limit", 500, strings.Repeat("b", 256), "HTTP 500: " + strings.Repeat("b", 256)},
		{"one past the limit", 400, strings.Repeat("c", 256) + "TAIL", "HTTP 400: " + strings.Repeat("c", 256)},
		{"much longer than the limit", 422, strings.Repeat("0123456789", 1000), "HTTP 422: " + strings.Repeat("0123456789", 1000)[:256]},
		{"longer than the drain limit", 503, strings.Repeat("z", 200_000), "HTTP 503: " + strings.Repeat("z", 256)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := recordingApp(t, func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			h := newClient(t, srv.URL, 1)
			// Twice: a body left partly unread must not spoil the next call.
			for i := range 2 {
				res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")}))
				if res.Detail != tt.want {
					t.Errorf("call %d: Detail = %q (%d bytes), want %d bytes", i, res.Detail, len(res.Detail), len(tt.want))
				}
				if res.Status != tt.status {
					t.Errorf("call %d: Status = %d, want %d", i, res.Status, tt.status)
				}
			}
		})
	}
}

func TestDeliverRetryAfterDateUsesClock(t *testing.T) {
	tests := []struct {
		name       string
		retryAfter string
		want       time.Duration
	}{
		{"date ahead", now0.Add(45 * time.Second).Format(http.TimeFormat), 45 * time.Second},
		{"date behind", now0.Add(-45 * time.Second).Format(http.TimeFormat), 0},
		{"date beyond the cap", now0.Add(72 * time.Hour).Format(http.TimeFormat), 24 * time.Hour},
		{"seconds", "8", 8 * time.Second},
		{"garbage", "tomorrow-ish", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := recordingApp(t, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Retry-After", tt.retryAfter)
				w.WriteHeader(http.StatusServiceUnavailable)
			})
			h := newClient(t, srv.URL, 1)
			h.now = func() time.Time { return now0 }
			res := h.Deliver(context.Background(), request(&broker.Message{}))
			if res.Outcome != budget.Overload || res.RetryAfter != tt.want {
				t.Errorf("Outcome, RetryAfter = %v, %v; want overload, %v", res.Outcome, res.RetryAfter, tt.want)
			}
		})
	}
}

func TestDeliverLatency(t *testing.T) {
	const delay = 30 * time.Millisecond
	srv, _ := recordingApp(t, func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(delay)
		w.WriteHeader(http.StatusNoContent)
	})
	h := newClient(t, srv.URL, 1)
	res := h.Deliver(context.Background(), request(&broker.Message{}))
	if res.Outcome != budget.Success {
		t.Fatalf("result = %+v, want success", res)
	}
	if res.Latency < delay || res.Latency > 5*time.Second {
		t.Errorf("Latency = %v, want at least %v", res.Latency, delay)
	}
}

// A user and password in the handler URL go to the app as basic auth, on
// single and batched calls alike, unless the message carries its own
// Authorization.
func TestDeliverURLUserIsBasicAuth(t *testing.T) {
	srv, seen := recordingApp(t, nil)
	url := strings.Replace(srv.URL, "http://", "http://app:s3cret@", 1)
	h := newClient(t, url, 1)
	if res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")})); res.Outcome != budget.Success {
		t.Fatalf("Deliver: %+v", res)
	}
	if got := (<-seen).header.Get("Authorization"); got != "Basic YXBwOnMzY3JldA==" {
		t.Errorf("Authorization = %q, want basic auth of app:s3cret", got)
	}
	own := request(&broker.Message{Body: []byte("x"), Headers: broker.Headers{"Authorization": "Bearer t"}})
	h.Deliver(context.Background(), own)
	if got := (<-seen).header.Get("Authorization"); got != "Bearer t" {
		t.Errorf("Authorization = %q, want the message's own", got)
	}
	b := NewBatcher(h, BatchOptions{MaxMessages: 1, MaxWait: time.Millisecond})
	defer b.Close()
	b.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")}))
	if got := (<-seen).header.Get("Authorization"); got != "Basic YXBwOnMzY3JldA==" {
		t.Errorf("batch Authorization = %q, want basic auth of app:s3cret", got)
	}
}
