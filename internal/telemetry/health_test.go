package telemetry

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"handoff.dev/handoff/internal/testkit"
)

func TestHealthEndpoints(t *testing.T) {
	var appDown atomic.Bool
	s, err := Listen("127.0.0.1:0", []Check{
		{Name: "source a", Ready: func() error { return nil }},
		{Name: "app", Ready: func() error {
			if appDown.Load() {
				return errors.New("app unreachable")
			}
			return nil
		}},
	}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + s.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d, want 200", code)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz = %d, want 200 when every check passes", code)
	}
	appDown.Store(true)
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "app: app unreachable") {
		t.Errorf("/readyz = %d %q, want 503 naming the failing check", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d while not ready, want 200: the process is alive", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// serveHealth runs a health server on loopback until the test ends.
func serveHealth(t *testing.T, checks []Check, setup func(*Server)) func(path string) (int, string) {
	t.Helper()
	s, err := Listen("127.0.0.1:0", checks, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(s)
	}
	testkit.Serve(t, s.Run)
	return func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + s.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
}

// The probes a pod's kubelet asks: with the broker and the app away, the
// startup, running and liveness answers stay 200 (a pod's app must start,
// and stay in its Service, while the broker is down); /readyz says why it
// is not ready. Stopping makes /runningz and /readyz 503, never /startupz
// or /healthz.
func TestProbeEndpoints(t *testing.T) {
	var brokerDown, appDown, stopping atomic.Bool
	failing := func(b *atomic.Bool, why string) func() error {
		return func() error {
			if b.Load() {
				return errors.New(why)
			}
			return nil
		}
	}
	checks := []Check{
		{Name: "sidecar", Own: true, Ready: failing(&stopping, "shutting down")},
		{Name: "source orders", Ready: failing(&brokerDown, "not connected")},
		{Name: "app", Ready: failing(&appDown, "app unreachable")},
	}
	get := serveHealth(t, checks, func(s *Server) { s.HandleDrain("", func(context.Context) error { return nil }) })

	tests := []struct {
		name                      string
		broker, app, stop         bool
		startup, running, healthz int
		readyz                    int
		readyBody                 string
	}{
		{"all up", false, false, false, 200, 200, 200, 200, "ready\n"},
		{"broker down", true, false, false, 200, 200, 200, 503, "source orders: not connected\n"},
		{"app not listening", false, true, false, 200, 200, 200, 503, "app: app unreachable\n"},
		{"both away", true, true, false, 200, 200, 200, 503, "source orders: not connected\napp: app unreachable\n"},
		{"stopping", false, false, true, 200, 503, 200, 503, "sidecar: shutting down\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			brokerDown.Store(tc.broker)
			appDown.Store(tc.app)
			stopping.Store(tc.stop)
			for _, p := range []struct {
				path string
				want int
			}{{"/startupz", tc.startup}, {"/runningz", tc.running}, {"/healthz", tc.healthz}} {
				if code, body := get(p.path); code != p.want {
					t.Errorf("%s = %d %q, want %d", p.path, code, body, p.want)
				}
			}
			if code, body := get("/readyz"); code != tc.readyz || body != tc.readyBody {
				t.Errorf("/readyz = %d %q, want %d %q", code, body, tc.readyz, tc.readyBody)
			}
		})
	}
	if code, body := get("/runningz"); code != 503 || body != "sidecar: shutting down\n" {
		t.Errorf("/runningz while stopping = %d %q, want 503 naming it", code, body)
	}
}

// Without /drain, /startupz is 503: a native sidecar whose preStop hook
// would find nothing does not start.
func TestStartupNeedsDrain(t *testing.T) {
	get := serveHealth(t, nil, nil)
	if code, body := get("/startupz"); code != 503 || !strings.Contains(body, "shutdown.http_drain") {
		t.Errorf("/startupz without /drain = %d %q, want 503 naming shutdown.http_drain", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d, want 200", code)
	}
}

// With a token, /drain drains only for a request that carries it: none,
// another, a prefix of it, or it under another scheme, is 401 and drains
// nothing; the token itself drains.
func TestDrainNeedsToken(t *testing.T) {
	const token = "5f0c1e9a7b3d42e8a6c0f1b2d3e4a5b6"
	var drains atomic.Int32
	s, err := Listen("127.0.0.1:0", nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s.HandleDrain(token, func(context.Context) error { drains.Add(1); return nil })
	testkit.Serve(t, s.Run)
	drain := func(auth string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+s.Addr()+"/drain", nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
			t.Error("a 401 without WWW-Authenticate")
		}
		return resp.StatusCode
	}
	for _, auth := range []string{"", "Bearer ", "Bearer wrong", "Bearer " + token[:31], "Bearer " + token + "x", "Basic " + token, token} {
		if code := drain(auth); code != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d, want 401", auth, code)
		}
	}
	if n := drains.Load(); n != 0 {
		t.Fatalf("%d drains from refused requests", n)
	}
	if code := drain("Bearer " + token); code != http.StatusOK || drains.Load() != 1 {
		t.Errorf("with the token: %d, %d drains; want 200 and one drain", code, drains.Load())
	}
}
