package sidecar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/config"
)

// buildConfig is a sidecar on one RabbitMQ source that nothing answers:
// Build dials nothing, so no broker is needed.
func buildConfig(t *testing.T) config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.Handler.URL = "http://127.0.0.1:1/events"
	cfg.Sources = []config.Source{{Name: "orders", RabbitMQ: &config.RabbitMQ{URL: "amqp://guest:guest@127.0.0.1:1/", Queue: "orders", Prefetch: 64}}}
	cfg.Retry.Tiers = []config.Duration{config.Duration(time.Second)}
	cfg.Journal.Path = filepath.Join(t.TempDir(), "handoff.db")
	cfg.Telemetry.MetricsListen = "127.0.0.1:0"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func quiet() Options { return Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))} }

// A Build that fails gives back what it made: the journal it opened (whose
// lock would keep the next Build waiting, then failing) and the listeners
// it bound.
func TestBuildGivesBackWhatItMadeOnError(t *testing.T) {
	cfg := buildConfig(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg.Admin.Listen, cfg.Admin.Token = taken.Addr().String(), "a-token-long-enough-for-the-admin-api"
	if _, err := Build(cfg, quiet()); err == nil {
		t.Fatal("Build succeeded with the admin port taken")
	}
	cfg.Admin.Listen = "127.0.0.1:0"
	s, err := Build(cfg, quiet())
	if err != nil {
		t.Fatalf("the second Build, on the same journal: %v", err)
	}
	health, admin := s.HealthAddr(), s.AdminAddr()
	if health == "" || admin == "" {
		t.Fatalf("bound health %q, admin %q", health, admin)
	}
	// Run on a context already ended: it stops at once, in order, and
	// closes everything, the listeners among them.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, addr := range []string{health, admin} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still listening after Run returned", addr)
		}
	}
}

// What Build refuses of a config that passed Validate is a ConfigError,
// which the command turns into exit 2.
func TestBuildRefusesATokenFileOthersCanRead(t *testing.T) {
	cfg := buildConfig(t)
	cfg.Admin.TokenFile = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(cfg.Admin.TokenFile, []byte("a-token-long-enough-for-the-admin-api\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Build(cfg, quiet())
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Build: %v, want a ConfigError", err)
	}
	if _, err := os.Stat(cfg.Journal.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the journal was opened before the token was refused (%v)", err)
	}
}

// A prefetch that holds the calls back is said at start-up: below
// handler.max_concurrency as a warning, below its default as a note, and
// not at all from the default up, even where AMQP's 16-bit count caps the
// default below four a call.
func TestBuildSaysWhenThePrefetchHoldsCallsBack(t *testing.T) {
	const said = "prefetch is below"
	for _, tc := range []struct {
		maxConcurrency, prefetch int // prefetch 0: the default
		want                     string
	}{
		{64, 32, "level=WARN"},
		{64, 128, "level=INFO"},
		{64, 0, ""},
		{64, 512, ""},
		{20000, 0, ""},
	} {
		prefetch := ""
		if tc.prefetch > 0 {
			prefetch = fmt.Sprintf(", prefetch: %d", tc.prefetch)
		}
		cfg, err := config.Parse(fmt.Appendf(nil, `handler: {url: "http://127.0.0.1:1/events", max_concurrency: %d}
sources:
  - name: orders
    rabbitmq: {url: "amqp://guest:guest@127.0.0.1:1/", queue: orders%s}
retry: {tiers: [1s]}
journal: {path: %q}
`, tc.maxConcurrency, prefetch, filepath.Join(t.TempDir(), "handoff.db")))
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		s, err := Build(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.Run(ctx); err != nil {
			t.Fatalf("Run: %v", err)
		}
		var line string
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, said) {
				line = l
			}
		}
		switch {
		case tc.want == "" && line != "":
			t.Errorf("max_concurrency %d, prefetch %d (%d in effect): said %q", tc.maxConcurrency, tc.prefetch, cfg.Sources[0].RabbitMQ.Prefetch, line)
		case tc.want != "" && !strings.Contains(line, tc.want):
			t.Errorf("max_concurrency %d, prefetch %d: said %q, want a line at %s", tc.maxConcurrency, tc.prefetch, line, tc.want)
		}
	}
}
