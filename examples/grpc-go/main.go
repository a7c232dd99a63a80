// Command grpc-go is a Handoff handler written in Go: it serves
// handoff.handler.v1.MessageHandler and answers each order with an outcome.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
)

type orders struct {
	handlerv1.UnimplementedMessageHandlerServer
}

// Handle takes one message. Returning an outcome decides its fate; an error
// status does too (UNAVAILABLE: retry later, INVALID_ARGUMENT: dead-letter).
func (orders) Handle(ctx context.Context, r *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
	var order struct{ ID, Kind string }
	if err := json.Unmarshal(r.GetBody(), &order); err != nil {
		return nil, status.Error(codes.InvalidArgument, "not an order: "+err.Error())
	}
	if order.Kind == "bad" {
		return &handlerv1.HandleResponse{Outcome: handlerv1.Outcome_OUTCOME_PERMANENT, Detail: "unknown product"}, nil
	}
	if order.Kind == "flaky" && r.GetAttempt() == 1 {
		return nil, status.Error(codes.Unavailable, "stock service warming up")
	}
	log.Printf("order %s (event %s, attempt %d, redelivered %v) handled",
		order.ID, r.GetEvent().GetId(), r.GetAttempt(), r.GetRedelivered())
	return &handlerv1.HandleResponse{Outcome: handlerv1.Outcome_OUTCOME_SUCCESS}, nil
}

func main() {
	addr := flag.String("listen", "127.0.0.1:9000", "address to serve MessageHandler on")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	handlerv1.RegisterMessageHandlerServer(srv, orders{})
	log.Printf("MessageHandler listening on %s", ln.Addr())
	log.Fatal(srv.Serve(ln))
}
