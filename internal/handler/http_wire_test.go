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
