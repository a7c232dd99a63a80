package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
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

// anonymousMethods are the gRPC methods a caller without a token may call
// when anonymous reads are allowed: the status, which holds no message
// data. An event's timeline does not qualify: its evidence quotes the app's
// answers, which may hold personal data.
var anonymousMethods = map[string]bool{
	"/handoff.admin.v1.Admin/GetStatus": true,
}

// anonymousPatterns are the REST routes of anonymousMethods (admin.yaml).
var anonymousPatterns = map[string]bool{
	"/v1/status": true,
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
	return a.allow(header, anonymousMethods[method])
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

// restHeader is a request's Authorization header; several count as a wrong
// one, since which would count is a guess.
func restHeader(r *http.Request) string {
	switch vals := r.Header.Values("Authorization"); len(vals) {
	case 0:
		return ""
	case 1:
		return vals[0]
	}
	return "\x00"
}

// refuse is every refused REST call's answer: 401 and nothing else.
func refuse(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", "Bearer")
	w.WriteHeader(http.StatusUnauthorized)
}

// rest guards every REST path, whatever it decodes to: a call with a token
// must bring the right one, and one without gets past only when anonymous
// reads are allowed — and then only to the calls restCall lets through.
// It sits in front of the whole gateway: the gateway decodes escaped paths
// (/v1%2Fstatus) into routes that a guard on the "/v1/" prefix would miss.
func (a *authorizer) rest(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		header := restHeader(r)
		if header == "" && a.anonymousRead {
			next.ServeHTTP(w, r)
			return
		}
		if !a.allow(header, false) {
			refuse(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// restCall is the gateway's middleware: it decides by the route a call was
// matched to, as the gRPC side decides by method, so that an anonymous read
// reaches the status only.
func (a *authorizer) restCall(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		anonymous := false
		if pat, ok := runtime.HTTPPattern(r.Context()); ok {
			anonymous = anonymousPatterns[pat.String()]
		}
		if !a.allow(restHeader(r), anonymous) {
			refuse(w)
			return
		}
		next(w, r, params)
	}
}
