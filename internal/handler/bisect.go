package handler

import (
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"handoff.dev/handoff/internal/budget"
)

// A handler that crashes on one event fails the whole request it came in, so
// an answer for a whole batch says nothing about most of its messages.
// Charging each of them an attempt would walk the poison message's innocent
// batch-mates to the dead-letter queue with it. So a batch that fails as a
// whole is split in halves and each half is sent again, and so on, until the
// failing message stands alone (AWS Lambda's BisectBatchOnFunctionError):
// only a message that fails on its own, or in a batch of one, is charged
// the failure. One poison message in a batch of n costs 2·log2(n) extra
// requests; each is paid from the retry budget, and the halves in flight
// carry disjoint messages that already hold their slots of
// handler.max_concurrency, so splitting adds no concurrency.

// SplitBudget pays for the extra requests of splitting a failed batch
// (*budget.RetryBudget in the sidecar). It must be safe for concurrent use.
type SplitBudget interface {
	// TrySpend takes a token for one extra request without waiting; refund
	// returns it (called when that request succeeded: useful work is not
	// amplification).
	TrySpend() (refund func(), ok bool)
}

var _ SplitBudget = (*budget.RetryBudget)(nil)

// bisects reports whether a whole-batch answer may be about one message in
// it, and so is worth splitting the batch for: a server error (retry), a
// timeout or broken connection (unknown), and a rejection (permanent: an app
// that validates every event before handling any rejects the whole request
// for one bad event). Overload (429, 503) is about the app's capacity, and
// more requests would make it worse; unreachable means the app is down;
// defer and drop are the app's own decision about the batch.
func bisects(o budget.Outcome) bool {
	switch o {
	case budget.Retry, budget.Unknown, budget.Permanent:
		return true
	}
	return false
}

// splitLimit bounds the extra requests one batch of n may make: enough to
// isolate two failing messages (each costs at most 2·log2(n)). A batch with
// more of them looks like an app failing everything, where splitting further
// only multiplies the load; the messages left unsplit keep the batch's
// failure and come back in smaller batches (batchLimit).
func splitLimit(n int) int {
	return 4 * bits.Len(uint(n-1))
}

// bisection is the delivery of one batch, with its splits.
type bisection struct {
	b     *Batcher
	start time.Time
	extra atomic.Int64 // extra requests it may still make
}

// send delivers batch and answers each attempt in it.
func (b *Batcher) send(batch []*pending) {
	s := &bisection{b: b, start: b.now()}
	s.extra.Store(int64(splitLimit(len(batch))))
	s.run(batch, nil)
}

// run sends batch in one request and answers each of its attempts, splitting
// it when it fails as a whole. refund, when not nil, returns the token that
// paid for this request.
func (s *bisection) run(batch []*pending, refund func()) {
	each, whole, split := s.b.post(batch)
	if each != nil {
		if refund != nil {
			refund()
		}
		took := s.took()
		for i, p := range batch {
			s.answer(p, each[i], took)
		}
		return
	}
	if len(batch) == 1 || !split {
		// Overload and unreachable stop the splitting here too: the
		// answer is about the app, and it holds for this part as it is.
		s.answerAll(batch, whole)
		return
	}
	if whole.Outcome == budget.Unknown {
		// The app may have taken the request before it timed out or broke
		// off: the halves go again as redeliveries, as any attempt after an
		// unknown answer does. A copy of each request: the walk owns its own.
		for _, p := range batch {
			if !p.r.Redelivered {
				r := *p.r
				r.Redelivered = true
				p.r = &r
			}
		}
	}
	// Both halves are paid for before either is sent: a half that failed
	// and splits again must not take the token its sibling was owed, or
	// what a budget buys would depend on which request answered first.
	type paid struct {
		part   []*pending
		refund func()
	}
	var sends [2]paid
	mid := len(batch) / 2
	for i, part := range [][]*pending{batch[:mid], batch[mid:]} {
		part = s.sendable(part, whole)
		if len(part) == 0 {
			continue
		}
		refund, why := s.pay()
		if why != "" {
			res := whole
			res.Detail += " (batch of " + strconv.Itoa(len(part)) + " not split further: " + why + ")"
			s.answerAll(part, res)
			continue
		}
		sends[i] = paid{part, refund}
	}
	var halves sync.WaitGroup
	for _, h := range sends {
		if h.part != nil {
			halves.Go(func() { s.run(h.part, h.refund) })
		}
	}
	halves.Wait()
}

// sendable returns the attempts of part worth sending again; the others get
// res: those whose caller stopped waiting, and those too close to their
// deadline for another request.
func (s *bisection) sendable(part []*pending, res Result) []*pending {
	now := s.b.now()
	out := make([]*pending, 0, len(part))
	for _, p := range part {
		if p.ctx.Err() != nil || !p.r.Deadline.IsZero() && p.r.Deadline.Sub(now) < max(s.b.minCall, time.Millisecond) {
			s.answer(p, res, now.Sub(s.start))
			continue
		}
		out = append(out, p)
	}
	return out
}

// pay takes what one extra request costs: one of the batch's extra requests
// and a token of the budget. why says what was missing.
func (s *bisection) pay() (refund func(), why string) {
	if s.extra.Add(-1) < 0 {
		return nil, "split limit reached"
	}
	if s.b.budget == nil {
		return nil, ""
	}
	refund, ok := s.b.budget.TrySpend()
	if !ok {
		s.extra.Add(1)
		return nil, "retry budget empty"
	}
	return refund, ""
}

// took is the time since the batch was first sent: the latency of every
// answer its request brought, read once for all of them.
func (s *bisection) took() time.Duration { return s.b.now().Sub(s.start) }

func (s *bisection) answer(p *pending, res Result, took time.Duration) {
	res.Latency = took
	if then := p.then; then != nil {
		// Nobody else holds p: the batch is done with it.
		p.free()
		then.Answered(res)
		return
	}
	p.res <- res
}

func (s *bisection) answerAll(batch []*pending, res Result) {
	took := s.took()
	for _, p := range batch {
		s.answer(p, res, took)
	}
}
