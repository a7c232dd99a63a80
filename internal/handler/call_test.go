package handler

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/testkit"
)

// countingApp is an app that counts the connections it accepted and those
// it closed.
func countingApp(t *testing.T, h http.HandlerFunc, configure func(*http.Server)) (srv *httptest.Server, opened, closed *atomic.Int64) {
	t.Helper()
	opened, closed = new(atomic.Int64), new(atomic.Int64)
	srv = httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			closed.Add(1)
		}
	}
	if configure != nil {
		configure(srv.Config)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, opened, closed
}

// Whatever shape the answer's body has, a connection whose answer was read
// to its end carries the next call; one whose body is longer than is worth
// draining, or whose answer says close, does not.
func TestDeliverReusesTheConnectionAfterEachKindOfAnswer(t *testing.T) {
	tests := []struct {
		name    string
		respond http.HandlerFunc
		status  int
		reused  bool
	}{
		{"empty", func(w http.ResponseWriter, _ *http.Request) {}, 200, true},
		{"with a length", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }, 200, true},
		{"no content", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }, 204, true},
		{"chunked", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "part one, ")
			http.NewResponseController(w).Flush()
			_, _ = io.WriteString(w, "part two")
		}, 200, true},
		{"chunked with a trailer", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Trailer", "X-Checksum")
			_, _ = io.WriteString(w, "body")
			http.NewResponseController(w).Flush()
			w.Header().Set("X-Checksum", "abc")
		}, 200, true},
		{"failure with evidence", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, strings.Repeat("e", 1000))
		}, 500, true},
		{"interim answer first", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusAccepted)
		}, 202, true},
		{"longer than the drain limit", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, strings.Repeat("z", drainLimit+1))
		}, 200, false},
		{"connection close", func(w http.ResponseWriter, _ *http.Request) { w.Header().Set("Connection", "close") }, 200, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, opened, _ := countingApp(t, tt.respond, nil)
			h := newClient(t, srv.URL, 1)
			const calls = 3
			for i := range calls {
				res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")}))
				if res.Status != tt.status {
					t.Fatalf("call %d: %+v, want status %d", i, res, tt.status)
				}
			}
			want := int64(1)
			if !tt.reused {
				want = calls
			}
			if got := opened.Load(); got != want {
				t.Errorf("the app accepted %d connections for %d calls, want %d", got, calls, want)
			}
		})
	}
}

// A pooled connection the app closed while it was idle (its keep-alive
// timeout) is not given the next request: that call goes out on a new
// connection and succeeds, and the app sees it once.
func TestDeliverPassesOverAConnectionTheAppClosedWhileIdle(t *testing.T) {
	var requests atomic.Int64
	srv, opened, closed := countingApp(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		requests.Add(1)
	}, func(s *http.Server) { s.IdleTimeout = 20 * time.Millisecond })
	h := newClient(t, srv.URL, 1)
	for i := range 3 {
		if res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")})); res.Outcome != budget.Success {
			t.Fatalf("call %d: %+v", i, res)
		}
		answered := time.Now()
		// The app closes the connection once it has been idle a while, and
		// the connection gets old enough to be looked at before its use.
		testkit.Eventually(t, 5*time.Second, "the app closing the idle connection", func() bool { return closed.Load() == int64(i+1) })
		testkit.Eventually(t, 5*time.Second, "the connection's idle age", func() bool { return time.Since(answered) > staleAfter })
	}
	if got := requests.Load(); got != 3 {
		t.Errorf("the app saw %d requests, want 3", got)
	}
	if got := opened.Load(); got != 3 {
		t.Errorf("the app accepted %d connections, want 3 (each call's own)", got)
	}
}

// An https app is called over TLS, its certificate verified; one the
// sidecar cannot verify is an unknown outcome with the reason, never a
// call in the clear.
func TestDeliverOverTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			t.Error("the request came in the clear")
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()

	h := newClient(t, srv.URL+"/events", 1)
	res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")}))
	if res.Outcome == budget.Success || !strings.Contains(res.Detail, "certificate") {
		t.Errorf("with the test CA unknown: %+v, want a failure that names the certificate", res)
	}

	h = newClient(t, srv.URL+"/events", 1)
	h.tls = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	h.tls.ServerName = "example.com" // the name httptest's certificate has
	h.tls.MinVersion = tls.VersionTLS12
	for i := range 2 {
		if res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")})); res.Outcome != budget.Success {
			t.Fatalf("call %d with the test CA trusted: %+v", i, res)
		}
	}
}

// An app on a unix socket gets the request at the URL's path, with the
// placeholder host, over one reused connection.
func TestDeliverOverAUnixSocket(t *testing.T) {
	path := t.TempDir() + "/app.sock"
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	seen := make(chan string, 4)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			seen <- r.Method + " " + r.Host + " " + r.URL.RequestURI() + " " + string(body)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	h := newClient(t, "http+unix://"+path+":/events?v=1", 1)
	for i := range 2 {
		if res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("hello")})); res.Outcome != budget.Success {
			t.Fatalf("call %d: %+v", i, res)
		}
		if got, want := <-seen, "POST localhost /events?v=1 hello"; got != want {
			t.Errorf("call %d: the app saw %q, want %q", i, got, want)
		}
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("%d connections for two calls in a row, want 1", got)
	}
}
