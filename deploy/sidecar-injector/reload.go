package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// reloader holds a value read from files, read again when one of them
// changes (a Secret or ConfigMap the kubelet updates in a volume). A read
// that fails keeps the value read before: a rotation half written, a bad
// edit, never takes away what works. It is safe for concurrent use.
type reloader[T any] struct {
	what  string // for the log: "certificate", "config"
	paths []string
	load  func() (T, error)
	log   *slog.Logger

	// every bounds how often the files are looked at: once per handshake
	// or review would be a stat of each file each time.
	every time.Duration

	mu      sync.Mutex
	val     T
	stamp   string // the files' sizes and times when val was read
	checked time.Time
}

// checkEvery is reloader.every outside tests.
const checkEvery = time.Second

// newReloader reads the value once: an error then is the caller's to
// return, as there is nothing to keep.
func newReloader[T any](what string, load func() (T, error), log *slog.Logger, paths ...string) (*reloader[T], error) {
	r := &reloader[T]{what: what, paths: paths, load: load, log: log, every: checkEvery}
	stamp, err := fileStamp(paths...)
	if err != nil {
		return nil, err
	}
	if r.val, err = load(); err != nil {
		return nil, err
	}
	r.stamp, r.checked = stamp, time.Now()
	return r, nil
}

// get returns the value, read again first if the files changed.
func (r *reloader[T]) get() T {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) < r.every {
		return r.val
	}
	r.checked = time.Now()
	stamp, err := fileStamp(r.paths...)
	if err != nil {
		r.log.Warn(r.what+" files unreadable; keeping the one loaded before", "err", err)
		return r.val
	}
	if stamp == r.stamp {
		return r.val
	}
	v, err := r.load()
	if err != nil {
		// Mid-rotation (one file written, the other not yet), or a bad
		// edit: the next change is looked at again.
		r.log.Warn(r.what+" does not load; keeping the one loaded before", "err", err)
		r.stamp = stamp
		return r.val
	}
	r.log.Info(r.what+" reloaded", "files", r.paths)
	r.val, r.stamp = v, stamp
	return r.val
}

func fileStamp(paths ...string) (string, error) {
	var s string
	for _, p := range paths {
		// Stat follows the kubelet's symbolic links to the files of the
		// volume's current version.
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
	}
	return s, nil
}

// certReloader serves the certificate in certFile and keyFile, read again
// when either file changes: a cert-manager renewal, a rotated Secret.
type certReloader struct{ *reloader[*tls.Certificate] }

func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	r, err := newReloader("certificate", func() (*tls.Certificate, error) {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load certificate: %w", err)
		}
		return &cert, nil
	}, log, certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return &certReloader{r}, nil
}

func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.get(), nil
}

// newConfigReloader reads the injector's config at path, and again when
// the ConfigMap it comes from changes; a config that does not load is
// logged and the one before is kept.
func newConfigReloader(path string, log *slog.Logger) (*reloader[Config], error) {
	return newReloader("config", func() (Config, error) { return loadConfig(path) }, log, path)
}
