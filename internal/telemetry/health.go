package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"handoff.dev/handoff/internal/redact"
)

// Check reports why a part of the sidecar is not ready, or nil.
type Check struct {
	Name  string
	Ready func() error
}

// Server serves /healthz and /readyz.
type Server struct {
	ln     net.Listener
	srv    *http.Server
	mux    *http.ServeMux
	log    *slog.Logger
	checks []Check
}

// Listen binds addr (port 0 picks a free port). metrics, when not nil,
// serves /metrics.
func Listen(addr string, checks []Check, metrics http.Handler, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("telemetry listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	s := &Server{ln: ln, log: log, checks: checks, mux: mux}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return s, nil
}

// HandleDrain serves GET /drain, before Run: drain starts the shutdown,
// and its answer waits until drain returns (or the caller leaves). A
// second call waits for the same drain.
func (s *Server) HandleDrain(drain func(ctx context.Context) error) {
	s.mux.HandleFunc("GET /drain", func(w http.ResponseWriter, r *http.Request) {
		s.log.Info("drain requested", "remote", r.RemoteAddr)
		if err := drain(r.Context()); err != nil {
			http.Error(w, redact.Text(err.Error()), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("drained\n"))
	})
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	var problems []string
	for _, c := range s.checks {
		// The body is open to anyone who can reach the port: a reason
		// quoting a broker or app URL must not carry its password.
		if err := c.Ready(); err != nil {
			problems = append(problems, redact.Text(c.Name+": "+err.Error()))
		}
	}
	if len(problems) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(strings.Join(problems, "\n") + "\n"))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

// Run serves until ctx is done, then shuts down within five seconds.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("telemetry server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}
