package handler

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/budget"
)

// SendBatch makes one HandleBatch call carrying reqs; the app answers each by
// its event id. A status instead of an answer is the whole batch's, split
// like HTTP's (bisects).
//
// An app that does not implement HandleBatch (UNIMPLEMENTED) is not a
// reason to dead-letter every message as permanent: the batch, and every
// later one, goes as one Handle call per message instead.
func (g *GRPC) SendBatch(ctx context.Context, reqs []*Request) (each []Result, whole Result, split bool) {
	if g.single.Load() {
		return g.sendOneByOne(ctx, reqs), Result{}, false
	}
	in := &handlerv1.HandleBatchRequest{Requests: make([]*handlerv1.HandleRequest, len(reqs))}
	for i, r := range reqs {
		in.Requests[i] = batchRequest(r)
	}
	bctx, tr := traceReach(ctx)
	resp, err := g.client.HandleBatch(bctx, in)
	if err != nil && tr.get() == answered && status.Code(err) == codes.Unimplemented {
		g.single.Store(true)
		return g.sendOneByOne(ctx, reqs), Result{}, false
	}
	if err != nil {
		o, after := g.classifier.GRPC(0, 0, err, tr.get(), g.connected())
		res := Result{Outcome: o, RetryAfter: after, Detail: grpcDetail(0, "", err)}
		return nil, res, bisects(o)
	}
	type answer struct {
		r     *handlerv1.HandleResult
		twice bool
	}
	byID := make(map[string]answer, len(resp.GetResults()))
	for _, r := range resp.GetResults() {
		_, seen := byID[r.GetId()]
		byID[r.GetId()] = answer{r, seen}
	}
	each = make([]Result, len(reqs))
	for i := range reqs {
		a, ok := byID[in.Requests[i].GetEvent().GetId()]
		if res, matched := matchResult(ok, a.twice); !matched {
			each[i] = res
			continue
		}
		o, after := g.classifier.GRPC(a.r.GetOutcome(), a.r.GetRetryAfter().AsDuration(), nil, answered, true)
		each[i] = Result{Outcome: o, RetryAfter: after}
		if o != budget.Success {
			each[i].Detail = grpcDetail(a.r.GetOutcome(), a.r.GetDetail(), nil)
		}
	}
	return each, Result{}, false
}

// sendOneByOne delivers each request with its own Handle call, all at once:
// they already hold their slots of the concurrency limit.
func (g *GRPC) sendOneByOne(ctx context.Context, reqs []*Request) []Result {
	each := make([]Result, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { each[i] = g.Deliver(ctx, r) })
	}
	wg.Wait()
	return each
}

// batchRequest is r's request in a batch: a HandleBatch call has one
// metadata for every event, so each event carries its trace context as its
// traceparent and tracestate extensions (eventTrace), as HTTP's batches do.
func batchRequest(r *Request) *handlerv1.HandleRequest {
	req := grpcRequest(r)
	if parent, state, ok := eventTrace(r); ok {
		req.Event.Extensions = withTraceMap(req.Event.Extensions, text(parent), text(state))
	}
	return req
}
