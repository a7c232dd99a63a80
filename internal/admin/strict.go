package admin

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	adminv1 "handoff.dev/handoff/api/admin/v1"
)

// The REST side refuses what it does not know, as a 400 naming it: a field
// misspelt in a body (repair_bdy) would otherwise approve without the
// repair, and a parameter misspelt in a query (state for states) would
// answer for everything instead of the selection asked. The gateway itself
// ignores both.

// strictJSON reads bodies refusing unknown fields, and writes answers as the
// gateway's default marshaler does.
var strictJSON = &runtime.HTTPBodyMarshaler{Marshaler: &runtime.JSONPb{
	MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
	UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
}}

// query is a REST call's query, kept for its request's check.
type query struct {
	keys []string
	path map[string]string // the parameters in the path, which a query may not repeat
}

type queryKey struct{}

// checkQuery refuses a query on a call whose request is its body (the
// gateway reads no query there), and keeps the query of any other call in
// its context for knownQuery.
func checkQuery(mux func() *runtime.ServeMux) runtime.Middleware {
	return func(next runtime.HandlerFunc) runtime.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
			if r.URL.RawQuery == "" {
				next(w, r, params)
				return
			}
			keys := slices.Sorted(maps.Keys(r.URL.Query()))
			if r.Method != http.MethodGet {
				err := status.Errorf(codes.InvalidArgument, "unknown query parameter(s): %s (this call reads its body only)", strings.Join(keys, ", "))
				runtime.HTTPError(r.Context(), mux(), strictJSON, w, r, err)
				return
			}
			next(w, r.WithContext(context.WithValue(r.Context(), queryKey{}, query{keys: keys, path: params})), params)
		}
	}
}

// knownQuery is nil unless the REST call that made req had a query
// parameter that names no field of req, or one its path gives.
func knownQuery(ctx context.Context, req proto.Message) error {
	q, ok := ctx.Value(queryKey{}).(query)
	if !ok {
		return nil // gRPC, or no query
	}
	var unknown []string
	for _, k := range q.keys {
		_, inPath := q.path[k]
		if inPath || !hasField(req.ProtoReflect().Descriptor(), strings.Split(k, ".")) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		return status.Errorf(codes.InvalidArgument, "unknown query parameter(s): %s", strings.Join(unknown, ", "))
	}
	return nil
}

// hasField reports whether path (by proto or JSON names) names a field of
// md, through its message fields.
func hasField(md protoreflect.MessageDescriptor, path []string) bool {
	for i, name := range path {
		fd := md.Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			fd = md.Fields().ByJSONName(name)
		}
		if fd == nil {
			return false
		}
		if i == len(path)-1 {
			return true
		}
		if fd.Message() == nil {
			return false
		}
		md = fd.Message()
	}
	return false
}

// strictOptions are the gateway's options for the strict REST side; guard
// runs first, so that nothing is said to a caller it refuses.
func strictOptions(guard runtime.Middleware, mux func() *runtime.ServeMux) []runtime.ServeMuxOption {
	return []runtime.ServeMuxOption{
		runtime.WithMarshalerOption(runtime.MIMEWildcard, strictJSON),
		runtime.WithMiddlewares(guard, checkQuery(mux)),
	}
}

// restService is the service as the gateway calls it: each call's query
// checked against its request first.
type restService struct{ *service }

func checked[Req proto.Message, Resp any](ctx context.Context, req Req, call func(context.Context, Req) (Resp, error)) (Resp, error) {
	if err := knownQuery(ctx, req); err != nil {
		var none Resp
		return none, err
	}
	return call(ctx, req)
}

func (s restService) GetStatus(ctx context.Context, r *adminv1.GetStatusRequest) (*adminv1.Status, error) {
	return checked(ctx, r, s.service.GetStatus)
}

func (s restService) GetEvent(ctx context.Context, r *adminv1.GetEventRequest) (*adminv1.Event, error) {
	return checked(ctx, r, s.service.GetEvent)
}

func (s restService) ListDeadLetters(ctx context.Context, r *adminv1.ListDeadLettersRequest) (*adminv1.ListDeadLettersResponse, error) {
	return checked(ctx, r, s.service.ListDeadLetters)
}

func (s restService) GetDeadLetter(ctx context.Context, r *adminv1.GetDeadLetterRequest) (*adminv1.DeadLetter, error) {
	return checked(ctx, r, s.service.GetDeadLetter)
}

func (s restService) ApproveDeadLetter(ctx context.Context, r *adminv1.ApproveDeadLetterRequest) (*adminv1.DeadLetter, error) {
	return checked(ctx, r, s.service.ApproveDeadLetter)
}

func (s restService) TerminateDeadLetter(ctx context.Context, r *adminv1.TerminateDeadLetterRequest) (*adminv1.DeadLetter, error) {
	return checked(ctx, r, s.service.TerminateDeadLetter)
}

func (s restService) CreateReplay(ctx context.Context, r *adminv1.CreateReplayRequest) (*adminv1.Replay, error) {
	return checked(ctx, r, s.service.CreateReplay)
}

func (s restService) GetReplay(ctx context.Context, r *adminv1.GetReplayRequest) (*adminv1.Replay, error) {
	return checked(ctx, r, s.service.GetReplay)
}

func (s restService) ListReplays(ctx context.Context, r *adminv1.ListReplaysRequest) (*adminv1.ListReplaysResponse, error) {
	return checked(ctx, r, s.service.ListReplays)
}

func (s restService) CancelReplay(ctx context.Context, r *adminv1.CancelReplayRequest) (*adminv1.Replay, error) {
	return checked(ctx, r, s.service.CancelReplay)
}

func (s restService) PauseReplay(ctx context.Context, r *adminv1.PauseReplayRequest) (*adminv1.Replay, error) {
	return checked(ctx, r, s.service.PauseReplay)
}

func (s restService) ResumeReplay(ctx context.Context, r *adminv1.ResumeReplayRequest) (*adminv1.Replay, error) {
	return checked(ctx, r, s.service.ResumeReplay)
}

func (s restService) GetActivity(ctx context.Context, r *adminv1.GetActivityRequest) (*adminv1.Activity, error) {
	return checked(ctx, r, s.service.GetActivity)
}
