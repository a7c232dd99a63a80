package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// authorizer decides whether a call may in, from its Authorization header.
// It is safe for concurrent use.
type authorizer struct {
	// sum is the SHA-256 of the token; nil when no token is configured.
	// Comparing digests keeps the comparison's time independent of the
	// token's length as well as of its content.
	sum           []byte
	anonymousRead bool
}

func newAuthorizer(token []byte, anonymousRead bool) *authorizer {
	a := &authorizer{anonymousRead: anonymousRead}
	if len(token) > 0 {
		s := sha256.Sum256(token)
		a.sum = s[:]
	}
	return a
}

// allow reports whether a call with the given Authorization header value
// may in; read says the call only reads. A call without a header may in
// only to read, and only with anonymous reads allowed; one with a header
// must carry the token, whatever it calls.
func (a *authorizer) allow(header string, read bool) bool {
	if header == "" {
		return read && a.anonymousRead
	}
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || a.sum == nil {
		return false
	}
	s := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(s[:], a.sum) == 1
}

// readMethods are the gRPC methods that only read.
var readMethods = map[string]bool{
	"/handoff.admin.v1.Admin/GetStatus": true,
	"/handoff.admin.v1.Admin/GetEvent":  true,
}

// errUnauthenticated is every refused gRPC call's answer: the code and
// nothing else, so that a caller learns nothing of why.
var errUnauthenticated = status.Error(codes.Unauthenticated, "")

func (a *authorizer) grpcAllow(ctx context.Context, method string) bool {
	var header string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) == 1 {
			header = v[0]
		} else if len(v) > 1 {
			return false // which one would count is a guess: none does
		}
	}
	return a.allow(header, readMethods[method])
}

func (a *authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if !a.grpcAllow(ctx, info.FullMethod) {
		return nil, errUnauthenticated
	}
	return next(ctx, req)
}

func (a *authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	if !a.grpcAllow(ss.Context(), info.FullMethod) {
		return errUnauthenticated
	}
	return next(srv, ss)
}

// rest guards the REST calls: an unauthorized one gets 401 with an empty
// body. GET and HEAD only read.
func (a *authorizer) rest(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		vals := r.Header.Values("Authorization")
		header := ""
		switch len(vals) {
		case 0:
		case 1:
			header = vals[0]
		default:
			header = "\x00" // several: none counts
		}
		read := r.Method == http.MethodGet || r.Method == http.MethodHead
		if !a.allow(header, read) {
			w.Header().Set("WWW-Authenticate", "Bearer")
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
