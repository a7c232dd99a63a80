package handler

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"strings"

	"handoff.dev/handoff/internal/redact"
)

// Transport is the protocol the app speaks.
type Transport uint8

const (
	// TransportHTTP is a POST per message (or per batch), CloudEvents
	// binary (or batched) content mode.
	TransportHTTP Transport = iota + 1
	// TransportGRPC is handoff.handler.v1.MessageHandler.
	TransportGRPC
)

func (t Transport) String() string {
	switch t {
	case TransportHTTP:
		return "http"
	case TransportGRPC:
		return "grpc"
	}
	return "unknown"
}

// Target is where the app listens, read from handler.url.
type Target struct {
	Transport Transport
	// TLS: https:// or grpcs://, verified against the system roots.
	TLS bool
	// Network and Addr are what to dial: tcp host:port, or unix and the
	// socket's path.
	Network, Addr string
	// Path is the HTTP request path (and query); empty for gRPC.
	Path string
}

// URL forms, one per transport and network:
//
//	http://host:port/path, https://host:port/path
//	http+unix:///run/app.sock             POST / over the socket
//	http+unix:///run/app.sock:/events     POST /events over the socket
//	grpc://host:port, grpcs://host:port
//	grpc+unix:///run/app.sock
//
// A bare unix:// does not say which protocol the app speaks over the
// socket, so it is refused with the two spellings that do.
var (
	// errUnixAmbiguous is returned for a unix:// URL.
	errUnixAmbiguous = errors.New("unix:// does not say the protocol: use http+unix:///path/app.sock (POST /; add :/events for another path) or grpc+unix:///path/app.sock")
	// errGRPCPath is returned for a gRPC URL with a path: the method is
	// fixed by the contract.
	errGRPCPath = errors.New("a gRPC handler URL names host:port only; the app implements handoff.handler.v1.MessageHandler")
)

// ParseURL reads handler.url. Its errors never quote a password.
func ParseURL(raw string) (Target, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Target{}, fmt.Errorf("not a URL: %w", redact.Error(err))
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return Target{}, fmt.Errorf("no host in %q", redact.URL(raw))
		}
		tg := Target{Transport: TransportHTTP, TLS: u.Scheme == "https", Network: "tcp", Addr: hostPort(u, "80", "443")}
		return tg, nil
	case "grpc", "grpcs":
		if u.Host == "" || u.Hostname() == "" {
			return Target{}, fmt.Errorf("no host in %q", redact.URL(raw))
		}
		if u.Port() == "" {
			return Target{}, fmt.Errorf("no port in %q: gRPC has no default port, write host:port", redact.URL(raw))
		}
		if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return Target{}, errGRPCPath
		}
		if u.User != nil {
			return Target{}, errors.New("a gRPC handler URL carries no user or password")
		}
		return Target{Transport: TransportGRPC, TLS: u.Scheme == "grpcs", Network: "tcp", Addr: u.Host}, nil
	case "http+unix", "grpc+unix":
		if u.Host != "" {
			return Target{}, fmt.Errorf("%s://%s...: the socket's path starts after the third slash, e.g. %s:///run/app.sock", u.Scheme, u.Host, u.Scheme)
		}
		sock, reqPath := u.Path, ""
		if u.Scheme == "http+unix" {
			reqPath = "/"
			if i := strings.Index(sock, ":/"); i >= 0 {
				sock, reqPath = sock[:i], sock[i+1:]
			}
			if u.RawQuery != "" {
				reqPath += "?" + u.RawQuery
			}
		} else if u.RawQuery != "" || u.Fragment != "" || strings.Contains(sock, ":/") {
			return Target{}, errGRPCPath
		}
		if sock == "" || !path.IsAbs(sock) {
			return Target{}, fmt.Errorf("%s needs the socket's absolute path, e.g. %s:///run/app.sock", u.Scheme, u.Scheme)
		}
		tr := TransportHTTP
		if u.Scheme == "grpc+unix" {
			tr = TransportGRPC
		}
		return Target{Transport: tr, Network: "unix", Addr: sock, Path: reqPath}, nil
	case "unix":
		return Target{}, errUnixAmbiguous
	}
	return Target{}, fmt.Errorf("scheme %q not supported; use http://, https://, http+unix://, grpc://, grpcs:// or grpc+unix://", u.Scheme)
}

// hostPort is u's host with its scheme's default port when it has none.
func hostPort(u *url.URL, plain, tls string) string {
	if u.Port() != "" {
		return u.Host
	}
	port := plain
	if u.Scheme == "https" || u.Scheme == "grpcs" {
		port = tls
	}
	return net.JoinHostPort(u.Hostname(), port)
}
