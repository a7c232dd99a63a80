package dev

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/handler"
)

// order is the demo's message body.
type order struct {
	ID   string `json:"id"`
	Kind string `json:"kind"` // ok, flaky, early, bad, down
}

// kindOf is the kind of the i-th order (from 0). Only an app of the user's
// own gets early orders, whose precondition it finds unmet at first: the
// demo app's answers stay what they have always been.
func kindOf(i int, app bool) string {
	switch {
	case i%10 == 4:
		return "bad"
	case i%12 == 10:
		return "down"
	case i%5 == 2:
		return "flaky"
	case app && i%7 == 5:
		return "early"
	}
	return "ok"
}

// answer is the demo app's answer to one attempt, spelled for both
// transports, so that the HTTP and the gRPC demo apps behave the same.
type answer struct {
	status  int               // HTTP
	outcome handlerv1.Outcome // gRPC, with an OK status
	code    codes.Code        // gRPC status instead of an answer, when not OK
	says    string            // what the account prints after the answer
	detail  string
	handled bool
}

// decide answers by the order's kind and attempt: most succeed, flaky
// ones are busy on their first attempt, bad ones are rejected, down ones
// fail every time.
func decide(o order, attempt int) answer {
	switch {
	case o.Kind == "bad":
		return answer{status: 422, outcome: handlerv1.Outcome_OUTCOME_PERMANENT, says: "rejected: the app cannot take it", detail: "unknown product"}
	case o.Kind == "down":
		return answer{status: 500, code: codes.Internal, says: "error: retried until attempts run out", detail: "database error"}
	case o.Kind == "flaky" && attempt == 1:
		return answer{status: 503, code: codes.ResourceExhausted, says: "busy: retried later", detail: "busy"}
	}
	return answer{status: 200, says: "handled", handled: true}
}

// grpcWords is how the gRPC demo app's account names an answer: the status
// code, or the outcome given with OK.
func (a answer) grpcWords() string {
	if a.code != codes.OK {
		return handler.CodeName(a.code)
	}
	if a.outcome == handlerv1.Outcome_OUTCOME_UNSPECIFIED {
		return "OK"
	}
	return a.outcome.String()[len("OUTCOME_"):]
}

// grpcApp is the demo app over gRPC: the same answers as the HTTP one.
type grpcApp struct {
	handlerv1.UnimplementedMessageHandlerServer
	acct *account
}

func (d grpcApp) Handle(_ context.Context, r *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
	var o order
	if err := json.Unmarshal(r.GetBody(), &o); err != nil {
		return nil, grpcstatus.Error(codes.InvalidArgument, "not an order")
	}
	ans := decide(o, int(r.GetAttempt()))
	d.acct.called(o.ID, strconv.Itoa(int(r.GetAttempt())), ans.grpcWords(), ans)
	if ans.code != codes.OK {
		return nil, grpcstatus.Error(ans.code, ans.detail)
	}
	return &handlerv1.HandleResponse{Outcome: ans.outcome, Detail: ans.detail}, nil
}

// startApp serves the demo app on loopback over transport (http or grpc),
// its serving goroutine in wg, and returns its handler.url, how to show it,
// and what stops it.
func startApp(wg *sync.WaitGroup, transport string, acct *account) (url, shown string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", nil, err
	}
	addr := ln.Addr().String()
	if transport == "grpc" {
		srv := grpc.NewServer()
		handlerv1.RegisterMessageHandlerServer(srv, grpcApp{acct: acct})
		wg.Go(func() { _ = srv.Serve(ln) })
		return "grpc://" + addr, "grpc://" + addr, srv.Stop, nil
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var o order
		body, _ := io.ReadAll(r.Body)
		attempt := r.Header.Get("Handoff-Attempt")
		if err := json.Unmarshal(body, &o); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		n, _ := strconv.Atoi(attempt)
		ans := decide(o, n)
		acct.called(o.ID, attempt, strconv.Itoa(ans.status), ans)
		w.WriteHeader(ans.status)
		_, _ = w.Write([]byte(ans.detail))
	})}
	wg.Go(func() { _ = srv.Serve(ln) })
	return "http://" + addr + "/events", addr, func() { _ = srv.Close() }, nil
}
