package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/broker"
)

// grpcAnswer is what the gRPC test app answers one event with.
type grpcAnswer struct {
	outcome    handlerv1.Outcome
	retryAfter time.Duration
	detail     string
	// code, when not OK, is the status Handle answers with instead.
	code codes.Code
	// hang answers only once the call's deadline has passed.
	hang bool
}

// grpcApp is the gRPC twin of app: a MessageHandler on loopback that records
// every event it is handed into rec as the HTTP app would have seen it (its
// fields as the binary-mode headers), so the same checks read both, and
// answers with reply.
type grpcApp struct {
	handlerv1.UnimplementedMessageHandlerServer
	rec   *app
	reply func(c call, prior []call) grpcAnswer
	srv   *grpc.Server
}

// newGRPCApp serves a gRPC app on addr ("" picks a port) and returns it and
// the recording; with addr reserved but not yet served, start it later with
// serve.
func newGRPCApp(t *testing.T, reply func(c call, prior []call) grpcAnswer) *grpcApp {
	t.Helper()
	g := &grpcApp{rec: &app{t: t}, reply: reply}
	t.Cleanup(g.stop)
	return g
}

func (g *grpcApp) serve(t *testing.T, addr string) {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	g.rec.addr = ln.Addr().String()
	g.srv = grpc.NewServer()
	handlerv1.RegisterMessageHandlerServer(g.srv, g)
	go func() { _ = g.srv.Serve(ln) }()
}

func (g *grpcApp) stop() {
	if g.srv != nil {
		g.srv.Stop()
	}
}

func (g *grpcApp) url() string { return "grpc://" + g.rec.addr }

// record keeps r as a call and returns the calls before it for its event.
func (g *grpcApp) record(r *handlerv1.HandleRequest) (call, []call) {
	ev := r.GetEvent()
	h := http.Header{}
	for k, v := range r.GetHeaders() {
		h.Set(k, v)
	}
	for k, v := range ev.GetExtensions() {
		h.Set("Ce-"+k, v)
	}
	h.Set("Ce-Id", ev.GetId())
	h.Set("Ce-Source", ev.GetSource())
	h.Set("Ce-Type", ev.GetType())
	h.Set("Ce-Specversion", ev.GetSpecVersion())
	if ct := ev.GetDataContentType(); ct != "" {
		h.Set("Content-Type", ct)
	}
	h.Set("Handoff-Attempt", strconv.Itoa(int(r.GetAttempt())))
	if r.GetDeadline() != nil {
		h.Set("Handoff-Deadline", r.GetDeadline().AsTime().UTC().Format(broker.TimeLayout))
	}
	h.Set("Handoff-Redelivered", strconv.FormatBool(r.GetRedelivered()))
	if r.GetReplayId() != "" {
		h.Set("Handoff-Replay-Id", r.GetReplayId())
	}
	c := call{At: time.Now(), Header: h, Body: r.GetBody()}
	a := g.rec
	a.mu.Lock()
	defer a.mu.Unlock()
	var prior []call
	for _, p := range a.calls {
		if p.Header.Get("Ce-Id") == ev.GetId() {
			prior = append(prior, p)
		}
	}
	a.calls = append(a.calls, c)
	return c, prior
}

func (g *grpcApp) Handle(ctx context.Context, r *handlerv1.HandleRequest) (*handlerv1.HandleResponse, error) {
	c, prior := g.record(r)
	// The attempt's fields travel as metadata too.
	md, _ := metadata.FromIncomingContext(ctx)
	for k, want := range map[string]string{
		"handoff-attempt": c.Header.Get("Handoff-Attempt"), "handoff-redelivered": c.Header.Get("Handoff-Redelivered"),
		"handoff-deadline": c.Header.Get("Handoff-Deadline"),
	} {
		if got := md.Get(k); len(got) != 1 || got[0] != want {
			g.rec.t.Errorf("metadata %s = %v, want %q as in the request", k, got, want)
		}
	}
	ans := g.reply(c, prior)
	if ans.hang {
		<-ctx.Done()
		return nil, grpcstatus.FromContextError(ctx.Err()).Err()
	}
	if ans.code != codes.OK {
		return nil, grpcstatus.Error(ans.code, ans.detail)
	}
	resp := &handlerv1.HandleResponse{Outcome: ans.outcome, Detail: ans.detail}
	if ans.retryAfter > 0 {
		resp.RetryAfter = durationpb.New(ans.retryAfter)
	}
	return resp, nil
}

// HandleBatch answers each event as Handle would. A result carries an
// outcome, not a status: an event whose answer is a status gets the outcome
// the status means (codeOutcome), and one whose status means unknown gets
// no result, which means the same.
func (g *grpcApp) HandleBatch(ctx context.Context, r *handlerv1.HandleBatchRequest) (*handlerv1.HandleBatchResponse, error) {
	g.rec.mu.Lock()
	g.rec.batches = append(g.rec.batches, len(r.GetRequests()))
	g.rec.mu.Unlock()
	out := &handlerv1.HandleBatchResponse{}
	for _, q := range r.GetRequests() {
		c, prior := g.record(q)
		ans := g.reply(c, prior)
		if ans.hang {
			<-ctx.Done()
			return nil, grpcstatus.FromContextError(ctx.Err()).Err()
		}
		res := &handlerv1.HandleResult{Id: q.GetEvent().GetId(), Outcome: ans.outcome, Detail: ans.detail}
		if ans.code != codes.OK {
			o, ok := codeOutcome[ans.code]
			if !ok {
				continue
			}
			res.Outcome = o
		}
		if ans.retryAfter > 0 {
			res.RetryAfter = durationpb.New(ans.retryAfter)
		}
		out.Results = append(out.Results, res)
	}
	return out, nil
}

// codeOutcome is the outcome each status code stands for in the contract
// (handler.proto); DEADLINE_EXCEEDED and CANCELLED, unknown, have none.
var codeOutcome = map[codes.Code]handlerv1.Outcome{
	codes.Unavailable: handlerv1.Outcome_OUTCOME_RETRY, codes.Aborted: handlerv1.Outcome_OUTCOME_RETRY,
	codes.Internal: handlerv1.Outcome_OUTCOME_RETRY, codes.Unknown: handlerv1.Outcome_OUTCOME_RETRY,
	codes.DataLoss: handlerv1.Outcome_OUTCOME_RETRY, codes.ResourceExhausted: handlerv1.Outcome_OUTCOME_OVERLOAD,
	codes.FailedPrecondition: handlerv1.Outcome_OUTCOME_DEFER, codes.InvalidArgument: handlerv1.Outcome_OUTCOME_PERMANENT,
	codes.Unimplemented: handlerv1.Outcome_OUTCOME_PERMANENT, codes.NotFound: handlerv1.Outcome_OUTCOME_PERMANENT,
	codes.OutOfRange: handlerv1.Outcome_OUTCOME_PERMANENT, codes.PermissionDenied: handlerv1.Outcome_OUTCOME_PERMANENT,
	codes.Unauthenticated: handlerv1.Outcome_OUTCOME_PERMANENT, codes.AlreadyExists: handlerv1.Outcome_OUTCOME_PERMANENT,
}

// scriptApp serves an app for transport ("http" or "grpc") that answers by
// an HTTP script, and returns its recording and handler URL: over gRPC each
// answer is translated (grpcFromHTTP), so a test written for the HTTP app
// runs unchanged against a gRPC one.
func scriptApp(t *testing.T, transport string, respond func(w http.ResponseWriter, c call, prior []call)) (*app, string) {
	t.Helper()
	if transport == "http" {
		a := newApp(t, respond)
		return a, a.url()
	}
	g := newGRPCApp(t, func(c call, prior []call) grpcAnswer {
		rec := httptest.NewRecorder()
		respond(rec, c, prior)
		return grpcFromHTTP(rec)
	})
	g.serve(t, "")
	return g.rec, g.url()
}

// grpcFromHTTP says over gRPC what an HTTP answer says: Handoff-Outcome as
// the outcome enum, Retry-After as retry_after, and a status as the status
// code that the contract maps to the same outcome.
func grpcFromHTTP(rec *httptest.ResponseRecorder) grpcAnswer {
	ans := grpcAnswer{detail: rec.Body.String()}
	if v := rec.Header().Get("Retry-After"); v != "" {
		secs, _ := strconv.Atoi(v)
		ans.retryAfter = time.Duration(secs) * time.Second
	}
	if o, ok := map[string]handlerv1.Outcome{
		"success": handlerv1.Outcome_OUTCOME_SUCCESS, "retry": handlerv1.Outcome_OUTCOME_RETRY, "overload": handlerv1.Outcome_OUTCOME_OVERLOAD,
		"defer": handlerv1.Outcome_OUTCOME_DEFER, "dead-letter": handlerv1.Outcome_OUTCOME_PERMANENT, "drop": handlerv1.Outcome_OUTCOME_DROP,
	}[rec.Header().Get("Handoff-Outcome")]; ok {
		ans.outcome = o
		return ans
	}
	switch s := rec.Code; {
	case s/100 == 2:
	case s == http.StatusConflict:
		ans.code = codes.FailedPrecondition
	case s == http.StatusGone:
		ans.outcome = handlerv1.Outcome_OUTCOME_DROP // no status code means drop
	case s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable:
		if ans.retryAfter > 0 {
			ans.outcome = handlerv1.Outcome_OUTCOME_OVERLOAD // a status carries no retry_after
		} else {
			ans.code = codes.ResourceExhausted
		}
	case s/100 == 4:
		ans.code = codes.InvalidArgument
	default:
		ans.code = codes.Internal
	}
	return ans
}
