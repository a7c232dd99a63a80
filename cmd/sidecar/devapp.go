package main

import (
	"context"
	"encoding/json"
	"net"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/handler"
)

// devAnswer is the demo app's answer to one attempt, spelled for both
// transports, so that the HTTP and the gRPC demo apps behave the same.
type devAnswer struct {
	status  int               // HTTP
	outcome handlerv1.Outcome // gRPC, with an OK status
	code    codes.Code        // gRPC status instead of an answer, when not OK
	says    string            // what the account prints after the answer
	detail  string
	handled bool
}

// devDecide answers by the order's kind and attempt: most succeed, flaky
// ones are busy on their first attempt, bad ones are rejected, down ones
// fail every time.
func devDecide(o devOrder, attempt int) devAnswer {
	switch {
	case o.Kind == "bad":
		return devAnswer{status: 422, outcome: handlerv1.Outcome_OUTCOME_PERMANENT, says: "rejected: the app cannot take it", detail: "unknown product"}
	case o.Kind == "down":
		return devAnswer{status: 500, code: codes.Internal, says: "error: retried until attempts run out", detail: "database error"}
	case o.Kind == "flaky" && attempt == 1:
		return devAnswer{status: 503, code: codes.ResourceExhausted, says: "busy: retried later", detail: "busy"}
	}
	return devAnswer{status: 200, says: "handled", handled: true}
}

// grpcWords is how the gRPC demo app's account names an answer: the status
// code, or the outcome given with OK.
func (a devAnswer) grpcWords() string {
	if a.code != codes.OK {
		return handler.CodeName(a.code)
	}
	if a.outcome == handlerv1.Outcome_OUTCOME_UNSPECIFIED {
		return "OK"
	}
	return a.outcome.String()[len("OUTCOME_"):]
}

// devGRPCApp is the demo app over gRPC: the same answers as the HTTP one.
type devGRPCApp struct {
	handlerv1.UnimplementedMessageHandlerServer
	acct *devAccount
}

func (d devGRPCApp) Handle(_ context.Context, r *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
	var o devOrder
	if err := json.Unmarshal(r.GetBody(), &o); err != nil {
		return nil, grpcstatus.Error(codes.InvalidArgument, "not an order")
	}
	ans := devDecide(o, int(r.GetAttempt()))
	d.acct.called(o.ID, strconv.Itoa(int(r.GetAttempt())), ans.grpcWords(), ans)
	if ans.code != codes.OK {
		return nil, grpcstatus.Error(ans.code, ans.detail)
	}
	return &handlerv1.HandleResponse{Outcome: ans.outcome, Detail: ans.detail}, nil
}

// startDevGRPCApp serves the demo app over gRPC on loopback.
func startDevGRPCApp(acct *devAccount) (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := grpc.NewServer()
	handlerv1.RegisterMessageHandlerServer(srv, devGRPCApp{acct: acct})
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), srv.Stop, nil
}
