package handler

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
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
			h.tr.DialContext = handoff.dial
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

// newRequest builds what http.NewRequestWithContext builds for the same
// URL and body: the same line, host and length, a body that reads the same,
// and a GetBody (with which the transport resends a request that a closed
// pooled connection never took) that reads it again.
func TestNewRequestMatchesNetHTTP(t *testing.T) {
	tests := []struct {
		name string
		url  string
		// sent is the URL requests go to, when not url itself.
		sent string
		body []byte
	}{
		{"path and query", "http://127.0.0.1:8080/events?x=1", "", []byte("payload")},
		{"empty port", "http://app:/events", "", []byte("p")},
		{"no path", "http://localhost", "", nil},
		{"user in the URL", "http://u:p@[::1]:9000/e", "", []byte("{}")},
		{"unix socket", "http+unix:///run/app.sock:/events", "http://localhost/events", []byte("x")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newClient(t, tt.url, 1)
			ctx := context.WithValue(context.Background(), struct{}{}, "v")
			got := h.newRequest(ctx, tt.body, http.Header{"X": {"y"}})
			sent := tt.url
			if tt.sent != "" {
				sent = tt.sent
			}
			want, err := http.NewRequestWithContext(ctx, http.MethodPost, sent, bytes.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got.Method != want.Method || got.URL.String() != want.URL.String() || got.Host != want.Host ||
				got.Proto != want.Proto || got.ProtoMajor != want.ProtoMajor || got.ProtoMinor != want.ProtoMinor ||
				got.ContentLength != want.ContentLength || got.Context() != ctx {
				t.Errorf("newRequest = %s %s host %q %s length %d, want %s %s host %q %s length %d",
					got.Method, got.URL, got.Host, got.Proto, got.ContentLength, want.Method, want.URL, want.Host, want.Proto, want.ContentLength)
			}
			if (got.Body == http.NoBody) != (want.Body == http.NoBody) {
				t.Errorf("body is NoBody: %v, want %v", got.Body == http.NoBody, want.Body == http.NoBody)
			}
			if got.Header.Get("X") != "y" {
				t.Errorf("header = %v, want the one given", got.Header)
			}
			for i, read := range []func() (io.ReadCloser, error){
				func() (io.ReadCloser, error) { return got.Body, nil }, got.GetBody, got.GetBody,
			} {
				if read == nil {
					t.Fatal("no GetBody")
				}
				rc, err := read()
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(rc)
				if err != nil || !bytes.Equal(b, tt.body) {
					t.Errorf("read %d = %q, %v; want %q", i, b, err, tt.body)
				}
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
