package handler

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
)

// wireCount counts what a client's connections cost on the wire.
type wireCount struct {
	dials, writes atomic.Int64
}

// countingConn counts its writes: each is one write system call.
type countingConn struct {
	net.Conn
	c *wireCount
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.c.writes.Add(1)
	return c.Conn.Write(p)
}

// dial is a DialContext that counts connections and their writes.
func (w *wireCount) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	w.dials.Add(1)
	return &countingConn{Conn: conn, c: w}, nil
}

// TestDeliverWritesLikePlainClient makes the same calls through Deliver and
// through a plain http.Client and compares their writes: the request's head
// and body go out in as few writes as the plain client's (one, while they fit
// the transport's buffer), over one reused connection. A body the transport
// cannot see is in memory, or a head flushed on its own, would show here as
// an extra write per call.
func TestDeliverWritesLikePlainClient(t *testing.T) {
	tests := []struct {
		name        string
		body        []byte
		contentType string
		headers     broker.Headers
		respond     string
	}{
		{"small body", []byte(`{"order":42}`), "application/json", nil, ""},
		{"1 KiB body and message headers", bytes.Repeat([]byte("x"), 1024), "",
			broker.Headers{"ce_id": "e", "tenant": "a", "ce_type": "com.example.order", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, ""},
		{"empty body", nil, "", nil, ""},
		{"answer with a body", []byte("m"), "", nil, "ok"},
		{"body past the write buffer", bytes.Repeat([]byte("0123456789abcdef"), 1024), "application/octet-stream", nil, ""},
	}
	const calls = 20
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Both clients' calls fit the app's record of 64.
			srv, _ := recordingApp(t, func(w http.ResponseWriter, _ *http.Request) {
				_, _ = io.WriteString(w, tt.respond)
			})

			var handoff wireCount
			h := newClient(t, srv.URL, 1)
			h.hc.DialTimeout = func(addr string, _ time.Duration) (net.Conn, error) {
				return handoff.dial(context.Background(), "tcp", addr)
			}
			for i := range calls {
				r := request(&broker.Message{Body: tt.body, ContentType: tt.contentType, Headers: tt.headers})
				r.EventID = "evt-" + strconv.Itoa(i)
				r.Deadline = time.Now().Add(time.Minute)
				if res := h.Deliver(context.Background(), r); res.Outcome != budget.Success {
					t.Fatalf("Deliver: %+v", res)
				}
			}

			var plain wireCount
			tr := &http.Transport{DialContext: plain.dial, MaxIdleConnsPerHost: 1}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			for i := range calls {
				req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(tt.body))
				if err != nil {
					t.Fatal(err)
				}
				setHeaders(req.Header, request(&broker.Message{Body: tt.body, ContentType: tt.contentType, Headers: tt.headers}))
				req.Header.Set("Ce-Id", "evt-"+strconv.Itoa(i))
				req.Header.Set("Handoff-Deadline", time.Now().Add(time.Minute).UTC().Format(broker.TimeLayout))
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}

			if got := handoff.dials.Load(); got != 1 {
				t.Errorf("Deliver dialed %d connections for %d calls in a row, want 1", got, calls)
			}
			got, want := handoff.writes.Load(), plain.writes.Load()
			if got > want {
				t.Errorf("Deliver made %d writes for %d calls, the plain client %d", got, calls, want)
			}
			if len(tt.body) < 2048 && got != calls {
				t.Errorf("Deliver made %d writes for %d calls, want one a call", got, calls)
			}
			t.Logf("%d calls: Deliver %d writes, plain client %d", calls, got, want)
		})
	}
}

// Every request's line and Host are what http.NewRequest writes for the same
// URL: the path and query as given, the host as the URL names it.
func TestRequestHeadMatchesNetHTTP(t *testing.T) {
	tests := []struct {
		name string
		url  string
		// sent is the URL requests go to, when not url itself.
		sent string
	}{
		{"path and query", "http://127.0.0.1:8080/events?x=1", ""},
		{"empty port", "http://app:/events", ""},
		{"no path", "http://localhost", ""},
		{"user in the URL", "http://u:p@[::1]:9000/e", "http://[::1]:9000/e"},
		{"escaped path", "http://app/a%2Fb/c d", ""},
		{"unix socket", "http+unix:///run/app.sock:/events", "http://localhost/events"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newClient(t, tt.url, 1)
			sent := tt.url
			if tt.sent != "" {
				sent = tt.sent
			}
			req, err := http.NewRequest(http.MethodPost, sent, nil)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := req.Write(&buf); err != nil {
				t.Fatal(err)
			}
			want := strings.Join(strings.SplitN(buf.String(), "\r\n", 3)[:2], "\r\n") + "\r\n"
			got := string(h.head)
			if !strings.HasPrefix(got, want) {
				t.Errorf("head = %q, want it to start %q", got, want)
			}
		})
	}
}

// The sidecar does not ask for compressed answers, so an error's evidence
// is what the app wrote, and an app that compresses on request does not.
func TestDeliverAsksForNoCompression(t *testing.T) {
	srv, seen := recordingApp(t, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, "order 42 has no lines")
	})
	h := newClient(t, srv.URL, 1)
	res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")}))
	if got := one(t, seen).header.Values("Accept-Encoding"); len(got) != 0 {
		t.Errorf("Accept-Encoding = %q, want none", got)
	}
	if res.Detail != "HTTP 422: order 42 has no lines" {
		t.Errorf("Detail = %q, want the app's own words", res.Detail)
	}
}
