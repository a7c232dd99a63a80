// Command sidecar-injector is Handoff's mutating admission webhook: a pod
// annotated handoff.dev/inject: "true" gets the Handoff sidecar, its config
// from a ConfigMap, its journal on a volume, and its probes. It shares
// nothing with the sidecar but the image name it injects.
//
//	sidecar-injector -config /etc/handoff-injector/config/config.yaml \
//	    -tls-cert /etc/handoff-injector/tls/tls.crt -tls-key /etc/handoff-injector/tls/tls.key
//	sidecar-injector certs -out deploy/sidecar-injector/manifests/tls
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == "certs" {
		err = runCerts(os.Args[2:])
	} else {
		err = run(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar-injector:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("sidecar-injector", flag.ContinueOnError)
	listen := fs.String("listen", ":8443", "HTTPS address the API server calls")
	cfgPath := fs.String("config", "/etc/handoff-injector/config/config.yaml", "the injector's config: the sidecar's image and defaults, reloaded when it changes")
	certFile := fs.String("tls-cert", "/etc/handoff-injector/tls/tls.crt", "serving certificate (PEM), reloaded when it changes")
	keyFile := fs.String("tls-key", "/etc/handoff-injector/tls/tls.key", "its private key (PEM)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := newConfigReloader(*cfgPath, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	certs, err := newCertReloader(*certFile, *keyFile, log)
	if err != nil {
		return err
	}
	return serve(ctx, ln, cfg.get, certs, log)
}

// serve answers on ln over TLS until ctx is done, then lets requests in
// flight finish.
func serve(ctx context.Context, ln net.Listener, cfg func() Config, certs *certReloader, log *slog.Logger) error {
	// 128 random bits a pod: the drain token guards one pod's /drain.
	wh := &webhook{cfg: cfg, log: log, newToken: rand.Text}
	srv := &http.Server{
		Handler:           wh.routes(),
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	log.Info("sidecar injector serving", "addr", ln.Addr().String(), "image", cfg().Image, "native_sidecar", cfg().NativeSidecar)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdown)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}
