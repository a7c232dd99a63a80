package handler

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
)

// The batcher is the same over gRPC: each event keeps its own outcome, and
// a batch that fails as a whole is split until the poison stands alone.
func TestGRPCBatch(t *testing.T) {
	a := &grpcApp{}
	a.batch = func(_ context.Context, r *handlerv1.HandleBatchRequest) (*handlerv1.HandleBatchResponse, error) {
		out := &handlerv1.HandleBatchResponse{}
		for _, q := range r.GetRequests() {
			id := q.GetEvent().GetId()
			switch id {
			case "e-3":
				return nil, status.Error(codes.Internal, "crashed") // the whole request fails
			case "e-1":
				out.Results = append(out.Results, &handlerv1.HandleResult{Id: id, Outcome: handlerv1.Outcome_OUTCOME_DEFER, RetryAfter: durationpb.New(time.Second)})
			case "e-2":
				// no result: unknown
			default:
				out.Results = append(out.Results, &handlerv1.HandleResult{Id: id})
			}
		}
		return out, nil
	}
	g := newGRPCClient(t, serveGRPC(t, a, "tcp"), nil)
	b := NewBatcher(g, BatchOptions{MaxMessages: 8, MaxWait: time.Minute, Budget: &tokens{left: 100}})
	defer b.Close()
	reqs := fresh(8)
	results := make([]Result, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { results[i] = b.Deliver(context.Background(), r) })
	}
	wg.Wait()
	want := map[int]budget.Outcome{1: budget.Defer, 2: budget.Unknown, 3: budget.Retry}
	for i, res := range results {
		w, ok := want[i]
		if !ok {
			w = budget.Success
		}
		if res.Outcome != w {
			t.Errorf("e-%d: %v (%s), want %v", i, res.Outcome, res.Detail, w)
		}
	}
	if results[1].RetryAfter != time.Second || results[3].Detail != "gRPC INTERNAL: crashed" {
		t.Errorf("e-1 retry after %v, e-3 detail %q", results[1].RetryAfter, results[3].Detail)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if last := a.batches[len(a.batches)-1]; !slices.Equal(last, []string{"e-3"}) && len(a.batches) < 3 {
		t.Errorf("batches %v: the poison was not split out", a.batches)
	}
}

// One connection carries every call; an app that allows fewer concurrent
// streams than calls in flight makes the rest wait, and a call that waits
// out its timeout for a stream never reached the app: overload, not unknown.
func TestGRPCNoFreeStreamIsOverload(t *testing.T) {
	release := make(chan struct{})
	a := &grpcApp{handle: func(context.Context, *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
		<-release
		return &handlerv1.HandleResponse{}, nil
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxConcurrentStreams(1))
	handlerv1.RegisterMessageHandlerServer(srv, a)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	g := newGRPCClient(t, "grpc://"+ln.Addr().String(), nil)
	done := make(chan Result, 1)
	go func() { done <- g.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")})) }()
	waitCalls(t, a, 1)
	r := request(&broker.Message{Body: []byte("y")})
	r.Timeout = 200 * time.Millisecond
	if res := g.Deliver(context.Background(), r); res.Outcome != budget.Overload {
		t.Errorf("no free stream: outcome %v (%s), want overload", res.Outcome, res.Detail)
	}
	close(release)
	if res := <-done; res.Outcome != budget.Success {
		t.Errorf("the call holding the stream: %v (%s)", res.Outcome, res.Detail)
	}
	if n := a.count(); n != 1 {
		t.Errorf("the app got %d calls, want 1", n)
	}
}

// grpcs:// verifies the app's certificate; a handshake that fails means no
// connection to the app: unreachable, as a refused connection.
func TestGRPCSHandshakeFailureIsUnreachable(t *testing.T) {
	a := &grpcApp{}
	url := serveGRPC(t, a, "tcp") // plaintext: the TLS handshake fails
	g := newGRPCClient(t, "grpcs://"+url[len("grpc://"):], nil)
	if res := g.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")})); res.Outcome != budget.Unreachable {
		t.Errorf("outcome %v (%s), want unreachable", res.Outcome, res.Detail)
	}
	if n := a.count(); n != 0 {
		t.Errorf("the app got %d calls", n)
	}
}

// A call that grpc-go refuses to send on a live connection — its header
// list is over what the app's server takes — is about that message, not
// the app: classified by its code (INTERNAL: retry), never unreachable,
// which would hold intake and try the same message again for ever while
// the probe kept passing.
func TestGRPCRefusedBeforeSendingOnALiveConnection(t *testing.T) {
	a := &grpcApp{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxHeaderListSize(1024))
	handlerv1.RegisterMessageHandlerServer(srv, a)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	defer func() { srv.Stop(); <-served }()
	g := newGRPCClient(t, "grpc://"+ln.Addr().String(), nil)
	if res := g.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")})); res.Outcome != budget.Success {
		t.Fatalf("a small call: %v (%s)", res.Outcome, res.Detail)
	}
	big := request(&broker.Message{Body: []byte("y"), Headers: broker.Headers{"tracestate": strings.Repeat("k=v,", 1024)}})
	res := g.Deliver(context.Background(), big)
	if res.Outcome != budget.Retry {
		t.Errorf("a call over the app's header limit: %v (%s), want retry", res.Outcome, res.Detail)
	}
	if err := g.Probe(context.Background()); err != nil {
		t.Errorf("probe: %v; the app is up", err)
	}
	if n := a.count(); n != 1 {
		t.Errorf("the app got %d calls, want the 1 small one", n)
	}
}

// singleOnlyApp implements Handle and not HandleBatch.
type singleOnlyApp struct {
	handlerv1.UnimplementedMessageHandlerServer
	mu  sync.Mutex
	ids []string
}

func (a *singleOnlyApp) Handle(_ context.Context, r *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
	a.mu.Lock()
	a.ids = append(a.ids, r.GetEvent().GetId())
	a.mu.Unlock()
	return &handlerv1.HandleResponse{}, nil
}

// Batch mode against an app without HandleBatch: its UNIMPLEMENTED is no
// verdict on the messages (which would dead-letter every one as permanent);
// each goes by Handle instead, this batch and every later one.
func TestGRPCBatchFallsBackToHandle(t *testing.T) {
	a := &singleOnlyApp{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	handlerv1.RegisterMessageHandlerServer(srv, a)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	defer func() { srv.Stop(); <-served }()
	g := newGRPCClient(t, "grpc://"+ln.Addr().String(), nil)
	b := NewBatcher(g, BatchOptions{MaxMessages: 4, MaxWait: 20 * time.Millisecond, Budget: &tokens{left: 100}})
	defer b.Close()
	for round := range 2 {
		reqs := make([]*Request, 4)
		for i := range reqs {
			reqs[i] = attempt(fmt.Sprintf("r%d-%d", round, i), nil, "")
		}
		for i, res := range deliverAll(b, reqs...) {
			if res.Outcome != budget.Success {
				t.Errorf("round %d, %s: %v (%s), want success", round, reqs[i].EventID, res.Outcome, res.Detail)
			}
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.ids) != 8 {
		t.Errorf("Handle took %d messages, want all 8: %v", len(a.ids), a.ids)
	}
}
