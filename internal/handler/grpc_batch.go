package handler

import (
	"context"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/budget"
)

// SendBatch makes one HandleBatch call carrying reqs; the app answers each by
// its event id. A status instead of an answer is the whole batch's, split
// like HTTP's (bisects).
func (g *GRPC) SendBatch(ctx context.Context, reqs []*Request) (each []Result, whole Result, split bool) {
	in := &handlerv1.HandleBatchRequest{Requests: make([]*handlerv1.HandleRequest, len(reqs))}
	for i, r := range reqs {
		in.Requests[i] = grpcRequest(r)
	}
	ctx, tr := traceReach(ctx)
	resp, err := g.client.HandleBatch(ctx, in)
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
