// Command grpc-go is a Handoff handler written in Go: it serves
// handoff.handler.v1.MessageHandler and answers each order with an outcome.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
)

// orders is the order service. done holds the id of every event handled:
// the sidecar narrows duplicates, but a producer's resend or a redelivery
// after a lost answer still reaches the app, which must not do the work
// twice. A real service keeps this in its database, written in the same
// transaction as the work; here mu stands for that transaction.
type orders struct {
	handlerv1.UnimplementedMessageHandlerServer
	mu   sync.Mutex
	done map[string]bool
}

// Handle takes one message. Returning an outcome decides its fate; an error
// status does too (UNAVAILABLE: retry later, INVALID_ARGUMENT: dead-letter).
func (s *orders) Handle(ctx context.Context, r *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
	var order struct{ ID, Kind string }
	if err := json.Unmarshal(r.GetBody(), &order); err != nil {
		return nil, status.Error(codes.InvalidArgument, "not an order: "+err.Error())
	}
	id := r.GetEvent().GetId()
	if r.GetRedelivered() {
		// A previous attempt may have done the work and lost its answer.
		log.Printf("redelivered event %s (attempt %d): it may have been handled already", id, r.GetAttempt())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done[id] {
		// Handled before: answer success again, without doing it again.
		log.Printf("duplicate %s (event %s): already handled, answering success again", order.ID, id)
		return &handlerv1.HandleResponse{Outcome: handlerv1.Outcome_OUTCOME_SUCCESS}, nil
	}
	if order.Kind == "bad" {
		return &handlerv1.HandleResponse{Outcome: handlerv1.Outcome_OUTCOME_PERMANENT, Detail: "unknown product"}, nil
	}
	if order.Kind == "flaky" && r.GetAttempt() == 1 {
		return nil, status.Error(codes.Unavailable, "stock service warming up")
	}
	s.done[id] = true
	log.Printf("order %s (event %s, attempt %d, redelivered %v) handled",
		order.ID, id, r.GetAttempt(), r.GetRedelivered())
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
	handlerv1.RegisterMessageHandlerServer(srv, &orders{done: map[string]bool{}})
	log.Printf("MessageHandler listening on %s", ln.Addr())
	log.Fatal(srv.Serve(ln))
}
