package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/console"
	"handoff.dev/handoff/internal/telemetry"
)

// shutdownTimeout bounds how long calls in progress may finish once the
// server stops.
const shutdownTimeout = 5 * time.Second

// Options configures a Server.
type Options struct {
	// Listen is host:port; port 0 picks a free port.
	Listen string
	// Token is what every call's bearer token must be; empty means no call
	// can bring a right one, so only anonymous reads (if allowed) get in.
	Token []byte
	// AllowAnonymousRead lets calls that only read in without a token.
	AllowAnonymousRead bool

	// Started is when the sidecar started.
	Started time.Time
	// NotReady reports why the sidecar cannot make progress now; nil when
	// it can.
	NotReady func() error
	Engine   Engine
	Journal  Journal
	Sources  []Source
	// DeadLetters serves the dead-letter and replay calls; nil answers
	// them Unavailable.
	DeadLetters DeadLetters
	// Activity is the history of each source's traffic the console charts;
	// nil answers GetActivity with no steps.
	Activity *telemetry.History
	// TokenName is who the ledger records for a change made with Token
	// (admin.token_name), followed by "/" and the operator the request
	// names, if any; DefaultTokenName when empty.
	TokenName string

	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Server serves the admin API on one listener. Build it with Listen and run
// it once with Run.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	grpc *grpc.Server
	log  *slog.Logger
}

// Listen binds o.Listen and builds the server; nothing is served until Run.
func Listen(o Options) (*Server, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.TokenName == "" {
		o.TokenName = DefaultTokenName
	}
	if o.Engine == nil || o.Journal == nil {
		return nil, errors.New("admin: an engine and a journal are required")
	}
	svc := &service{o: o, log: o.Logger}
	auth := newAuthorizer(o.Token, o.AllowAnonymousRead)

	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(auth.unary), grpc.ChainStreamInterceptor(auth.stream))
	adminv1.RegisterAdminServer(gs, svc)

	// The gateway calls the service in process, without a gRPC hop, so
	// the gRPC interceptors never see its calls: the REST side has its own
	// guard, in front of every path and again on every route.
	var gw *runtime.ServeMux
	gw = runtime.NewServeMux(strictOptions(auth.restCall, func() *runtime.ServeMux { return gw })...)
	if err := adminv1.RegisterAdminHandlerServer(context.Background(), gw, restService{svc}); err != nil {
		return nil, fmt.Errorf("admin gateway: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/openapi.json", openAPI)
	// The console's files hold nothing of the sidecar: open, as the
	// OpenAPI document is. What they show comes from /v1, behind the guard.
	ui := console.Handler()
	mux.Handle("GET "+console.Prefix, ui)
	mux.Handle("GET "+strings.TrimSuffix(console.Prefix, "/"), ui)
	mux.Handle("GET /{$}", http.RedirectHandler(console.Prefix, http.StatusFound))
	mux.Handle("/", auth.rest(gw)) // the gateway's own 404 past the guard

	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return nil, fmt.Errorf("admin listen %s: %w", o.Listen, err)
	}
	s := &Server{ln: ln, grpc: gs, log: o.Logger}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true) // h2c with prior knowledge: how gRPC clients dial
	s.srv = &http.Server{
		Handler:           route(gs, mux),
		Protocols:         &protocols,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(o.Logger.Handler(), slog.LevelDebug),
	}
	return s, nil
}

// route sends gRPC requests to grpcs and the rest to rest.
func route(grpcs *grpc.Server, rest http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			grpcs.ServeHTTP(w, r)
			return
		}
		rest.ServeHTTP(w, r)
	})
}

func openAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(adminv1.OpenAPI)
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx is done, then lets calls in progress finish for up to
// five seconds and closes what is left.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		s.grpc.Stop()
		return fmt.Errorf("admin server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if err != nil {
		_ = s.srv.Close()
	}
	// Connections served through ServeHTTP are the http.Server's; Stop
	// only ends what the grpc.Server still tracks of their streams.
	s.grpc.Stop()
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

// Close releases the listener of a server that never ran.
func (s *Server) Close() error { return s.ln.Close() }
