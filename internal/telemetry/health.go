package telemetry

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"handoff.dev/handoff/internal/redact"
)

// Check reports why a part of the sidecar is not ready, or nil.
type Check struct {
	Name  string
	Ready func() error
	// Own marks a check of the sidecar's own state (it is stopping), not
	// of a part it depends on (a broker, the app, the journal's room):
	// /runningz asks only these.
	Own bool
}

// Server serves the health endpoints, each answering one question:
//
//	/healthz   the process runs and answers (liveness)
//	/startupz  the process serves, /drain with it (a native sidecar's startup probe)
//	/runningz  the sidecar runs and is not stopping (its share of a pod's readiness)
//	/readyz    every source connected, the app reachable, the journal with room
//
// Only /readyz depends on the broker or the app: a probe that did would
// hold a pod's app back from starting, or take every replica out of its
// Service in a broker outage, and fix neither.
type Server struct {
	ln     net.Listener
	srv    *http.Server
	mux    *http.ServeMux
	log    *slog.Logger
	checks []Check
	// drain is set once /drain is served.
	drain atomic.Bool
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
	mux.HandleFunc("GET /startupz", s.startupz)
	mux.HandleFunc("GET /runningz", func(w http.ResponseWriter, _ *http.Request) { s.answer(w, true, "running\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { s.answer(w, false, "ready\n") })
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return s, nil
}

// HandleDrain serves GET /drain, before Run: drain starts the shutdown,
// and its answer waits until drain returns (or the caller leaves). A
// second call waits for the same drain.
//
// With a token, a request must carry it as its bearer token
// (Authorization: Bearer <token>, which a preStop hook's httpHeaders can
// send); one without it, or with another, is 401 and drains nothing.
// Without a token every caller may drain: the caller keeps the listener
// where only trusted ones reach it (config allows it on loopback only).
func (s *Server) HandleDrain(token string, drain func(ctx context.Context) error) {
	s.drain.Store(true)
	want := sha256.Sum256([]byte(token))
	s.mux.HandleFunc("GET /drain", func(w http.ResponseWriter, r *http.Request) {
		if token != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			// Compared as digests, in constant time: neither the bytes
			// nor the length of the token leak through the time taken.
			sum := sha256.Sum256([]byte(got))
			if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !ok {
				s.log.Warn("drain refused: no valid drain token", "remote", r.RemoteAddr)
				w.Header().Set("WWW-Authenticate", `Bearer realm="handoff drain"`)
				http.Error(w, "drain needs the pod's drain token (Authorization: Bearer)", http.StatusUnauthorized)
				return
			}
		}
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

// startupz answers once the server serves: after the journal opened and
// the sources were built, before any broker is reached. It is 503 when
// /drain is not served, since a preStop hook would then find nothing.
func (s *Server) startupz(w http.ResponseWriter, _ *http.Request) {
	if !s.drain.Load() {
		http.Error(w, "/drain is not served (shutdown.http_drain is off)", http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("started\n"))
}

// answer is 200 with ok when every check passes (only the Own ones when
// own), and otherwise 503 with each failing check's reason.
func (s *Server) answer(w http.ResponseWriter, own bool, ok string) {
	var problems []string
	for _, c := range s.checks {
		if own && !c.Own {
			continue
		}
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
	_, _ = w.Write([]byte(ok))
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

// Close releases the listener of a server that never ran.
func (s *Server) Close() error { return s.ln.Close() }
