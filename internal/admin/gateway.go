package admin

import (
	"context"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	adminv1 "handoff.dev/handoff/api/admin/v1"
)

// routeListDeadLetters registers GET /v1/deadletters (ListDeadLetters) again,
// in front of GET /v1/deadletters/{id=**} (GetDeadLetter): "**" matches no
// segment too, the gateway tries the route registered last first, and the
// generated code registers GetDeadLetter after ListDeadLetters, so the list
// would be asked as the dead letter with no id. The handler does what the
// generated one does; the mux's middlewares (the auth guard) wrap it alike.
func routeListDeadLetters(gw *runtime.ServeMux, svc adminv1.AdminServer) error {
	const method, path = "/handoff.admin.v1.Admin/ListDeadLetters", "/v1/deadletters"
	noPathParams := utilities.NewDoubleArray(nil)
	return gw.HandlePath(http.MethodGet, path, func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		var stream runtime.ServerTransportStream
		ctx = grpc.NewContextWithServerTransportStream(ctx, &stream)
		_, out := runtime.MarshalerForRequest(gw, r)
		actx, err := runtime.AnnotateIncomingContext(ctx, gw, r, method, runtime.WithHTTPPathPattern(path))
		if err != nil {
			runtime.HTTPError(ctx, gw, out, w, r, err)
			return
		}
		var req adminv1.ListDeadLettersRequest
		if err := r.ParseForm(); err != nil {
			runtime.HTTPError(actx, gw, out, w, r, grpcstatus.Error(codes.InvalidArgument, err.Error()))
			return
		}
		if err := runtime.PopulateQueryParameters(&req, r.Form, noPathParams); err != nil {
			runtime.HTTPError(actx, gw, out, w, r, grpcstatus.Error(codes.InvalidArgument, err.Error()))
			return
		}
		resp, err := svc.ListDeadLetters(actx, &req)
		actx = runtime.NewServerMetadataContext(actx, runtime.ServerMetadata{HeaderMD: stream.Header(), TrailerMD: stream.Trailer()})
		if err != nil {
			runtime.HTTPError(actx, gw, out, w, r, err)
			return
		}
		runtime.ForwardResponseMessage(actx, gw, out, w, r, resp, gw.GetForwardResponseOptions()...)
	})
}
