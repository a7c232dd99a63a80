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
