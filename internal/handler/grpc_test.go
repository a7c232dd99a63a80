package handler

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/testkit"
)

// grpcApp is a loopback MessageHandler that records each call and answers
// with handle (or, for HandleBatch, batch).
type grpcApp struct {
	handlerv1.UnimplementedMessageHandlerServer
	mu      sync.Mutex
	calls   []*handlerv1.HandleRequest
	md      []metadata.MD
	batches [][]string
	handle  func(ctx context.Context, r *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error)
	batch   func(ctx context.Context, r *handlerv1.HandleBatchRequest) (*handlerv1.HandleBatchResponse, error)
	srv     *grpc.Server
}

func (a *grpcApp) Handle(ctx context.Context, r *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	a.mu.Lock()
	a.calls = append(a.calls, r)
	a.md = append(a.md, md)
	a.mu.Unlock()
	if a.handle == nil {
		return &handlerv1.HandleResponse{}, nil
	}
	return a.handle(ctx, r)
}

func (a *grpcApp) HandleBatch(ctx context.Context, r *handlerv1.HandleBatchRequest) (*handlerv1.HandleBatchResponse, error) {
	var ids []string
	for _, q := range r.GetRequests() {
		ids = append(ids, q.GetEvent().GetId())
	}
	a.mu.Lock()
	a.batches = append(a.batches, ids)
	a.mu.Unlock()
	return a.batch(ctx, r)
}

// serveGRPC starts a on network (tcp or unix) and returns its handler URL.
func serveGRPC(t *testing.T, a *grpcApp, network string) string {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "app.sock")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	a.srv = grpc.NewServer()
	handlerv1.RegisterMessageHandlerServer(a.srv, a)
	go func() { _ = a.srv.Serve(ln) }()
	t.Cleanup(a.srv.Stop)
	if network == "unix" {
		return "grpc+unix://" + addr
	}
	return "grpc://" + ln.Addr().String()
}

func newGRPCClient(t *testing.T, url string, overrides map[string]string) *GRPC {
	t.Helper()
	c, err := mustClassifier(t, nil).WithGRPC(overrides)
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGRPC(GRPCOptions{URL: url, Classifier: c})
	if err != nil {
		t.Fatalf("NewGRPC(%q): %v", url, err)
	}
	t.Cleanup(g.Close)
	return g
}

func TestGRPCRequestCarriesWhatHeadersCarry(t *testing.T) {
	a := &grpcApp{}
	g := newGRPCClient(t, serveGRPC(t, a, "tcp"), nil)
	first := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	deadline := first.Add(time.Hour)
	r := &Request{
		Message: &broker.Message{
			Body: []byte{0, 1, 2, 0xff}, ContentType: "application/octet-stream",
			Headers: broker.Headers{
				"ce_type": "order.created", "ce_subject": "order-9", "ce_time": "2026-12-01T09:59:00Z",
				"ce_tenant": "acme", "ce-tenant": "zeta", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
				"x-request": "r-1", broker.HeaderAttempt: "9",
			},
		},
		EventID: "evt-1", Source: "/kafka/orders", Type: "handoff.message",
		Attempt: 2, FirstAttemptAt: first, Deadline: deadline, Redelivered: true, ReplayID: "rp-1",
		Origin: "kafka:orders/0/7", Timeout: 5 * time.Second,
	}
	res := g.Deliver(context.Background(), r)
	if res.Outcome != budget.Success {
		t.Fatalf("outcome %v (%s), want success", res.Outcome, res.Detail)
	}
	a.mu.Lock()
	got, md := a.calls[0], a.md[0]
	a.mu.Unlock()
	ev := got.GetEvent()
	if ev.GetId() != "evt-1" || ev.GetSource() != "/kafka/orders" || ev.GetType() != "order.created" || ev.GetSpecVersion() != "1.0" ||
		ev.GetSubject() != "order-9" || !ev.GetTime().AsTime().Equal(time.Date(2026, 12, 1, 9, 59, 0, 0, time.UTC)) ||
		ev.GetDataContentType() != "application/octet-stream" {
		t.Errorf("event = %v", ev)
	}
	if want := map[string]string{"tenant": "acme"}; fmt.Sprint(ev.GetExtensions()) != fmt.Sprint(want) {
		t.Errorf("extensions = %v, want %v (the smaller of two spellings)", ev.GetExtensions(), want)
	}
	if string(got.GetBody()) != string(r.Message.Body) {
		t.Errorf("body = %x", got.GetBody())
	}
	if h := got.GetHeaders(); h["x-request"] != "r-1" || h["traceparent"] == "" || len(h) != 2 {
		t.Errorf("headers = %v, want x-request and traceparent only (no ce_*, no handoff-*)", h)
	}
	if got.GetAttempt() != 2 || !got.GetFirstAttemptAt().AsTime().Equal(first) || !got.GetDeadline().AsTime().Equal(deadline) ||
		!got.GetRedelivered() || got.GetReplayId() != "rp-1" || got.GetOrigin() != "kafka:orders/0/7" {
		t.Errorf("attempt fields = %v", got)
	}
	for k, want := range map[string]string{
		"handoff-attempt": "2", "handoff-deadline": "2026-12-01T11:00:00.000Z", "handoff-redelivered": "true",
		"handoff-replay-id": "rp-1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	} {
		if v := md.Get(k); len(v) != 1 || v[0] != want {
			t.Errorf("metadata %s = %v, want %q", k, v, want)
		}
	}
	if dl, ok := deadlineOf(t, a, g, r); !ok || dl > 5*time.Second || dl < 4*time.Second {
		t.Errorf("call deadline %v (set %v), want the attempt's 5s timeout", dl, ok)
	}
}

// deadlineOf delivers r once more and returns the time left on the call's
// deadline as the app saw it.
func deadlineOf(t *testing.T, a *grpcApp, g *GRPC, r *Request) (time.Duration, bool) {
	t.Helper()
	var left time.Duration
	var ok bool
	a.handle = func(ctx context.Context, _ *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
		var dl time.Time
		dl, ok = ctx.Deadline()
		left = time.Until(dl)
		return &handlerv1.HandleResponse{}, nil
	}
	g.Deliver(context.Background(), r)
	return left, ok
}

func TestGRPCOutcomes(t *testing.T) {
	retryInfo := func(code codes.Code, d time.Duration) error {
		st, err := status.New(code, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	tests := []struct {
		name      string
		resp      *handlerv1.HandleResponse
		err       error
		overrides map[string]string
		want      budget.Outcome
		wantAfter time.Duration
		detail    string
	}{
		{name: "ok unspecified", resp: &handlerv1.HandleResponse{}, want: budget.Success},
		{name: "success", resp: &handlerv1.HandleResponse{Outcome: handlerv1.Outcome_OUTCOME_SUCCESS}, want: budget.Success},
		{name: "retry", resp: &handlerv1.HandleResponse{Outcome: handlerv1.Outcome_OUTCOME_RETRY, Detail: "db down"}, want: budget.Retry, detail: "RETRY: db down"},
		{name: "overload with retry_after", resp: &handlerv1.HandleResponse{Outcome: handlerv1.Outcome_OUTCOME_OVERLOAD, RetryAfter: durationpb.New(3 * time.Second)},
			want: budget.Overload, wantAfter: 3 * time.Second},
		{name: "defer", resp: &handlerv1.HandleResponse{Outcome: handlerv1.Outcome_OUTCOME_DEFER}, want: budget.Defer},
		{name: "permanent", resp: &handlerv1.HandleResponse{Outcome: handlerv1.Outcome_OUTCOME_PERMANENT, Detail: "bad sku"}, want: budget.Permanent, detail: "PERMANENT: bad sku"},
		{name: "drop", resp: &handlerv1.HandleResponse{Outcome: handlerv1.Outcome_OUTCOME_DROP}, want: budget.Drop},
		{name: "unknown enum value", resp: &handlerv1.HandleResponse{Outcome: 42}, want: budget.Unknown},
		{name: "app's UNAVAILABLE", err: status.Error(codes.Unavailable, "db"), want: budget.Retry, detail: "gRPC UNAVAILABLE: db"},
		{name: "ABORTED", err: status.Error(codes.Aborted, ""), want: budget.Retry},
		{name: "INTERNAL", err: status.Error(codes.Internal, ""), want: budget.Retry},
		{name: "UNKNOWN", err: status.Error(codes.Unknown, ""), want: budget.Retry},
		{name: "DATA_LOSS", err: status.Error(codes.DataLoss, ""), want: budget.Retry},
		{name: "RESOURCE_EXHAUSTED", err: status.Error(codes.ResourceExhausted, ""), want: budget.Overload},
		{name: "RESOURCE_EXHAUSTED with RetryInfo", err: retryInfo(codes.ResourceExhausted, 2*time.Second), want: budget.Overload, wantAfter: 2 * time.Second},
		{name: "app's DEADLINE_EXCEEDED", err: status.Error(codes.DeadlineExceeded, ""), want: budget.Unknown},
		{name: "CANCELLED", err: status.Error(codes.Canceled, ""), want: budget.Unknown},
		{name: "FAILED_PRECONDITION", err: status.Error(codes.FailedPrecondition, ""), want: budget.Defer},
		{name: "INVALID_ARGUMENT", err: status.Error(codes.InvalidArgument, "no sku"), want: budget.Permanent, detail: "gRPC INVALID_ARGUMENT: no sku"},
		{name: "UNIMPLEMENTED", err: status.Error(codes.Unimplemented, ""), want: budget.Permanent},
		{name: "NOT_FOUND", err: status.Error(codes.NotFound, ""), want: budget.Permanent},
		{name: "OUT_OF_RANGE", err: status.Error(codes.OutOfRange, ""), want: budget.Permanent},
		{name: "PERMISSION_DENIED", err: status.Error(codes.PermissionDenied, ""), want: budget.Permanent},
		{name: "UNAUTHENTICATED", err: status.Error(codes.Unauthenticated, ""), want: budget.Permanent},
		{name: "ALREADY_EXISTS", err: status.Error(codes.AlreadyExists, ""), want: budget.Permanent},
		{name: "override", err: status.Error(codes.NotFound, ""), overrides: map[string]string{"not_found": "retry"}, want: budget.Retry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &grpcApp{handle: func(context.Context, *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
				return tt.resp, tt.err
			}}
			g := newGRPCClient(t, serveGRPC(t, a, "tcp"), tt.overrides)
			res := g.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")}))
			if res.Outcome != tt.want || res.RetryAfter != tt.wantAfter {
				t.Errorf("outcome %v after %v (%s), want %v after %v", res.Outcome, res.RetryAfter, res.Detail, tt.want, tt.wantAfter)
			}
			if tt.detail != "" && res.Detail != tt.detail {
				t.Errorf("detail %q, want %q", res.Detail, tt.detail)
			}
		})
	}
}

// The app down and the app answering UNAVAILABLE are both UNAVAILABLE to
// grpc-go; only the first holds intake.
func TestGRPCAppDownIsUnreachable(t *testing.T) {
	addr := testkit.ClosedAddr(t)
	g := newGRPCClient(t, "grpc://"+addr, nil)
	r := request(&broker.Message{Body: []byte("x")})
	for i := range 3 { // the first call dials, later ones find the connection failed
		if res := g.Deliver(context.Background(), r); res.Outcome != budget.Unreachable {
			t.Fatalf("call %d: outcome %v (%s), want unreachable", i+1, res.Outcome, res.Detail)
		}
	}
	if err := g.Probe(context.Background()); err == nil {
		t.Fatal("Probe succeeded with nothing listening")
	}

	// The app comes up on the same address: once Probe sees it, the next
	// call reaches it without waiting out the connection's backoff.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	a := &grpcApp{handle: func(context.Context, *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
		return nil, status.Error(codes.Unavailable, "downstream down")
	}}
	srv := grpc.NewServer()
	handlerv1.RegisterMessageHandlerServer(srv, a)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	if err := g.Probe(context.Background()); err != nil {
		t.Fatalf("Probe with the app up: %v", err)
	}
	if res := g.Deliver(context.Background(), r); res.Outcome != budget.Retry {
		t.Errorf("the app's own UNAVAILABLE: outcome %v (%s), want retry", res.Outcome, res.Detail)
	}
}

func TestGRPCTimeoutAndBrokenCallAreUnknown(t *testing.T) {
	release := make(chan struct{})
	a := &grpcApp{handle: func(ctx context.Context, r *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
		if r.GetEvent().GetId() == "hang" {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		<-release
		return &handlerv1.HandleResponse{}, nil
	}}
	g := newGRPCClient(t, serveGRPC(t, a, "tcp"), nil)
	r := request(&broker.Message{Body: []byte("x")})
	r.EventID, r.Timeout = "hang", 100*time.Millisecond
	if res := g.Deliver(context.Background(), r); res.Outcome != budget.Unknown {
		t.Errorf("timeout: outcome %v (%s), want unknown", res.Outcome, res.Detail)
	}

	// The app dies with the call in flight: it may have been handled.
	r.EventID, r.Timeout = "broken", 5*time.Second
	done := make(chan Result, 1)
	go func() { done <- g.Deliver(context.Background(), r) }()
	waitCalls(t, a, 2)
	a.srv.Stop()
	if res := <-done; res.Outcome != budget.Unknown {
		t.Errorf("broken connection: outcome %v (%s), want unknown", res.Outcome, res.Detail)
	}
	close(release)
}

func (a *grpcApp) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.calls)
}

func waitCalls(t *testing.T, a *grpcApp, n int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d calls", n), func() bool { return a.count() >= n })
}

func TestUnixSockets(t *testing.T) {
	a := &grpcApp{}
	g := newGRPCClient(t, serveGRPC(t, a, "unix"), nil)
	if err := g.Probe(context.Background()); err != nil {
		t.Fatalf("gRPC probe over the socket: %v", err)
	}
	if res := g.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")})); res.Outcome != budget.Success {
		t.Errorf("gRPC over a unix socket: %v (%s)", res.Outcome, res.Detail)
	}

	sock := filepath.Join(t.TempDir(), "http.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	paths := make(chan string, 1)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths <- r.Method + " " + r.URL.RequestURI() + " " + r.Header.Get("Ce-Id")
	})}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	h := newClient(t, "http+unix://"+sock+":/events?v=1", 1)
	if err := h.Probe(context.Background()); err != nil {
		t.Fatalf("HTTP probe over the socket: %v", err)
	}
	if res := h.Deliver(context.Background(), request(&broker.Message{Body: []byte("x")})); res.Outcome != budget.Success {
		t.Fatalf("HTTP over a unix socket: %v (%s)", res.Outcome, res.Detail)
	}
	if got := <-paths; got != "POST /events?v=1 evt-1" {
		t.Errorf("the app got %q, want POST /events?v=1 evt-1", got)
	}
}

func TestParseURL(t *testing.T) {
	tests := []struct {
		url  string
		want Target
	}{
		{"http://127.0.0.1:8080/events", Target{Transport: TransportHTTP, Network: "tcp", Addr: "127.0.0.1:8080"}},
		{"https://app", Target{Transport: TransportHTTP, TLS: true, Network: "tcp", Addr: "app:443"}},
		{"http+unix:///run/app.sock", Target{Transport: TransportHTTP, Network: "unix", Addr: "/run/app.sock", Path: "/"}},
		{"http+unix:///run/app.sock:/events?x=1", Target{Transport: TransportHTTP, Network: "unix", Addr: "/run/app.sock", Path: "/events?x=1"}},
		{"grpc://127.0.0.1:9000", Target{Transport: TransportGRPC, Network: "tcp", Addr: "127.0.0.1:9000"}},
		{"grpcs://app:443/", Target{Transport: TransportGRPC, TLS: true, Network: "tcp", Addr: "app:443"}},
		{"grpc+unix:///run/app.sock", Target{Transport: TransportGRPC, Network: "unix", Addr: "/run/app.sock"}},
	}
	for _, tt := range tests {
		got, err := ParseURL(tt.url)
		if err != nil || got != tt.want {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", tt.url, got, err, tt.want)
		}
	}
	for _, bad := range []string{"unix:///run/app.sock", "grpc://app", "grpc://app:1/x", "grpc+unix://", "grpc+unix:///a.sock:/x", "ftp://x", "grpc://u:p@app:1"} {
		if _, err := ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) succeeded", bad)
		}
	}
}
