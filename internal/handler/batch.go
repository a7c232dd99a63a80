package handler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"handoff.dev/handoff/internal/budget"
)

// BatchContentType is the CloudEvents batched content mode's media type.
const BatchContentType = "application/cloudevents-batch+json"

// maxBatchResponse bounds the response body read for the per-event outcomes.
const maxBatchResponse = 16 << 20

// Batcher delivers attempts to the app several at a time, in one request of
// its BatchSender: over HTTP one POST in CloudEvents batched mode (a JSON
// array of structured events, see docs/app.md for the format), over gRPC one
// HandleBatch call; either is answered by one outcome per event. Each
// attempt still gets its own Result, so every message keeps its own outcome,
// attempt count, retry and dead-letter path; a batch that fails as a whole is
// split until the message that fails it stands alone (see bisect.go). It is
// safe for concurrent use; Deliver blocks until its attempt's answer is in.
// Close stops collecting and waits for the batches in flight.
type Batcher struct {
	t       BatchSender
	now     func() time.Time
	max     int
	wait    time.Duration
	budget  SplitBudget // nil: splits are not paid for
	minCall time.Duration
	sending sync.WaitGroup // batches in flight, joined by Close
	// senders takes a batch to a goroutine idle after sending one. A
	// batch's goroutine grows its stack deep in the HTTP client; one new
	// for each batch grew it again each time.
	senders chan []*pending // closed by Close: idle senders end
	workers sync.WaitGroup
	quit    sync.Once

	// The batches being filled, one per limit (batchLimit), under mu: the
	// attempt that fills one sends it, a timer the one whose wait is up.
	mu     sync.Mutex
	open   map[int]*gathering
	closed bool
}

type pending struct {
	ctx context.Context
	r   *Request
	res chan Result // buffered
	// then, when not nil, is told the answer instead of res (DeliverThen).
	then Then
}

// pendings are reused: an attempt answered, or never handed to a batch, is
// no longer held by one. One whose caller stopped waiting is not: its batch
// may still be in flight, and answers it later.
var pendings = sync.Pool{New: func() any { return &pending{res: make(chan Result, 1)} }}

func (p *pending) free() {
	p.ctx, p.r, p.then = nil, nil, nil
	pendings.Put(p)
}

// BatchOptions configures a Batcher.
type BatchOptions struct {
	// MaxMessages is the most attempts one request carries.
	MaxMessages int
	// MaxWait is how long a batch waits for more attempts after its first.
	MaxWait time.Duration
	// Budget pays for the extra requests of splitting a batch that failed as
	// a whole. Nil splits without paying; the bound on splits per batch
	// holds either way.
	Budget SplitBudget
	// MinCall is the least time before a message's deadline that is still
	// worth a request: a message with less left is not sent again when its
	// batch splits, it keeps the batch's failure.
	MinCall time.Duration
}

// BatchSender sends several attempts to the app in one request: *HTTP and
// *GRPC. Batching, splitting a failed batch, the split budget and the
// re-batching rule are the Batcher's, the same for every transport. It must
// be safe for concurrent use.
type BatchSender interface {
	// SendBatch makes one request carrying reqs, cancelled with ctx (whose
	// deadline is the request's timeout). When the app answers event by
	// event, each holds one Result per request, in order; otherwise whole
	// is the answer for every one of them, and split says whether it is an
	// answer that splitting the batch may improve on (bisects).
	SendBatch(ctx context.Context, reqs []*Request) (each []Result, whole Result, split bool)
	// Probe reports whether the app accepts connections.
	Probe(ctx context.Context) error
}

var (
	_ BatchSender = (*HTTP)(nil)
	_ BatchSender = (*GRPC)(nil)
)

// NewBatcher batches t's deliveries: a batch goes out when it holds
// o.MaxMessages attempts (fewer for re-attempts, see batchLimit) or o.MaxWait
// after its first one.
func NewBatcher(t BatchSender, o BatchOptions) *Batcher {
	return &Batcher{t: t, now: time.Now, max: max(o.MaxMessages, 1), wait: o.MaxWait, budget: o.Budget, minCall: o.MinCall,
		open: map[int]*gathering{}, senders: make(chan []*pending)}
}

// Close stops collecting, sends the batches being filled, and waits until
// every attempt already taken has its answer. It is safe to call twice.
func (b *Batcher) Close() {
	b.mu.Lock()
	b.closed = true
	for limit := range b.open {
		b.dispatch(limit)
	}
	b.mu.Unlock()
	b.sending.Wait()
	// Nothing is dispatched once closed is set: no send can follow.
	b.quit.Do(func() { close(b.senders) })
	b.workers.Wait()
}

// Probe reports whether the app accepts connections.
func (b *Batcher) Probe(ctx context.Context) error { return b.t.Probe(ctx) }

// Deliver adds r to the next batch and returns its own answer.
func (b *Batcher) Deliver(ctx context.Context, r *Request) Result {
	if ctx.Err() != nil {
		return Result{Outcome: budget.Unknown, Detail: "cancelled before it was sent"}
	}
	p := pendings.Get().(*pending)
	p.ctx, p.r = ctx, r
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		p.free()
		return Result{Outcome: budget.Unreachable, Detail: "sidecar stopping"}
	}
	b.add(p)
	b.mu.Unlock()
	select {
	case res := <-p.res:
		// Answered: the batch is done with it.
		p.free()
		return res
	case <-ctx.Done():
		// The batch may still reach the app: the effect is unknown.
		return Result{Outcome: budget.Unknown, Detail: "cancelled while its batch was in flight"}
	}
}

// Then is told the answer to an attempt handed over with DeliverThen.
type Then interface {
	Answered(Result)
}

// DeliverThen is Deliver without a goroutine waiting on the answer: r goes
// in the next batch, and then.Answered is called with its answer once, on
// the goroutine that has it — the batch's, or this one when r is not taken
// — possibly before DeliverThen returns. It is called while the batch goes
// on to answer the rest of its attempts, so it must not wait for long.
//
// One thing differs from Deliver: a ctx done while the batch is in flight
// is not answered at once. The batch's request is cancelled once no
// attempt in it has its context still going (post), and the answer comes
// then, with the batch's.
func (b *Batcher) DeliverThen(ctx context.Context, r *Request, then Then) {
	if ctx.Err() != nil {
		then.Answered(Result{Outcome: budget.Unknown, Detail: "cancelled before it was sent"})
		return
	}
	p := pendings.Get().(*pending)
	p.ctx, p.r, p.then = ctx, r, then
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		p.free()
		then.Answered(Result{Outcome: budget.Unreachable, Detail: "sidecar stopping"})
		return
	}
	b.add(p)
	b.mu.Unlock()
}

// batchLimit is the most attempts a batch holding r may carry. A re-attempt
// failed before, perhaps in a batch with a message that fails every request
// it is in; were the retry copies of one failed batch gathered again as they
// were, they would fail together again, each time charged an attempt
// whenever the split budget ran dry. So a re-attempt shares a batch only with
// re-attempts of the same limit, and the limit halves with every attempt:
// max, max/2, max/4 … 1. By attempt 1+log2(max) every message goes alone,
// so a poison message is alone before max_attempts however the budget
// stood, and a fresh message is never batched with a known failure. Retries
// are few next to fresh traffic (the retry budget sees to that), so the
// smaller batches cost little.
func (b *Batcher) batchLimit(r *Request) int {
	if r.Attempt <= 1 {
		return b.max
	}
	return max(b.max>>min(r.Attempt-1, 62), 1)
}

// gathering is a batch being filled.
type gathering struct {
	batch []*pending
	ids   map[string]bool
	// timer sends the batch MaxWait after its first attempt.
	timer *time.Timer
}

// add puts p in the open batch of its limit (batchLimit), opening one if
// there is none, and sends the batch once it is full. The app answers each
// event by its id, so a batch never holds two attempts with the same event
// id (two sources, or two replays, can share one): the second sends the
// batch off and opens the next one, or one answer would settle both. b.mu
// is held.
func (b *Batcher) add(p *pending) {
	limit := b.batchLimit(p.r)
	id := wireID(p.r.EventID)
	g := b.open[limit]
	if g != nil && g.ids[id] {
		b.dispatch(limit)
		g = nil
	}
	if g == nil {
		g = &gathering{batch: make([]*pending, 0, limit), ids: make(map[string]bool, limit)}
		g.timer = time.AfterFunc(b.wait, func() { b.due(limit, g) })
		b.open[limit] = g
	}
	g.batch = append(g.batch, p)
	g.ids[id] = true
	if len(g.batch) >= limit {
		b.dispatch(limit)
	}
}

// due sends g, the batch of limit, when its wait is up and it is still
// being filled.
func (b *Batcher) due(limit int, g *gathering) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open[limit] == g {
		b.dispatch(limit)
	}
}

// dispatch sends the open batch of limit. b.mu is held.
func (b *Batcher) dispatch(limit int) {
	g := b.open[limit]
	delete(b.open, limit)
	g.timer.Stop()
	b.sending.Add(1)
	select {
	case b.senders <- g.batch:
	default:
		b.workers.Add(1)
		go b.sender(g.batch)
	}
}

// senderIdle is how long a sender waits for another batch before it ends.
const senderIdle = 5 * time.Second

// sender sends batch, then each batch handed to it while it waits idle.
func (b *Batcher) sender(batch []*pending) {
	defer b.workers.Done()
	idle := time.NewTimer(senderIdle)
	defer idle.Stop()
	for {
		b.send(batch)
		b.sending.Done()
		idle.Reset(senderIdle)
		var ok bool
		select {
		case batch, ok = <-b.senders:
			if !ok {
				return
			}
		case <-idle.C:
			return
		}
	}
}

// batchResult is one event's answer in the app's response.
type batchResult struct {
	ID         string          `json:"id"`
	Outcome    string          `json:"outcome"`
	Status     int             `json:"status"`
	RetryAfter json.RawMessage `json:"retry_after"`
	Detail     string          `json:"detail"`
	twice      bool            // the response answers this id more than once
}

// post makes one request carrying batch and returns what SendBatch does.
// The request's timeout is the shortest of its attempts' own, cut to the
// time left before the earliest deadline among them; it is cancelled once
// no attempt in it has anyone waiting for its answer.
func (b *Batcher) post(batch []*pending) (each []Result, whole Result, split bool) {
	start := b.now()
	timeout := batch[0].r.Timeout
	reqs := make([]*Request, len(batch))
	for i, p := range batch {
		timeout = min(timeout, p.r.Timeout)
		if !p.r.Deadline.IsZero() {
			timeout = min(timeout, p.r.Deadline.Sub(start))
		}
		reqs[i] = p.r
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The attempts of a batch mostly share one context (the engine's): one
	// watch for each distinct one, not one for each attempt.
	var ctxs []context.Context
	for _, p := range batch {
		if !slices.Contains(ctxs, p.ctx) {
			ctxs = append(ctxs, p.ctx)
		}
	}
	var waiting atomic.Int64
	waiting.Store(int64(len(ctxs)))
	for _, c := range ctxs {
		stop := context.AfterFunc(c, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	return b.t.SendBatch(ctx, reqs)
}

// batchTimeout is a batch call's time: until ctx's deadline, or
// noDeadlineBatch without one.
func batchTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d)
	}
	return noDeadlineBatch
}

// noDeadlineBatch bounds a batch call whose context has no deadline.
const noDeadlineBatch = time.Minute

// SendBatch POSTs reqs in CloudEvents batched mode.
func (h *HTTP) SendBatch(ctx context.Context, reqs []*Request) (each []Result, whole Result, split bool) {
	c := getCallState()
	defer putCallState(c)
	body := appendBatch(getBatchBuf(), reqs)
	defer putBatchBuf(body)
	c.header.set("Content-Type", BatchContentType)
	a, err := h.post(ctx, batchTimeout(ctx), c.header, body, maxBatchResponse+1, evidenceLen, c)
	if err != nil {
		res := Result{Outcome: transportOutcome(err), Detail: errorDetail(err)}
		return nil, res, bisects(res.Outcome)
	}
	end := h.now()
	if a.status/100 != 2 {
		o, after := h.classifier.Answer(a.status, a.outcome, a.retryAfter, end)
		res := Result{Outcome: o, Status: a.status, RetryAfter: after, Detail: "HTTP " + strconv.Itoa(a.status)}
		if ev := strings.TrimSpace(string(a.body)); ev != "" {
			res.Detail += ": " + ev
		}
		return nil, res, bisects(res.Outcome)
	}
	data := a.body
	readErr := error(nil)
	if len(data) > maxBatchResponse {
		readErr = errors.New("batch response too long")
	}
	var results []batchResult
	if readErr == nil {
		results, readErr = readAnswer(data)
	}
	if readErr != nil {
		// The app took the batch but its answer cannot be read: any event
		// may have been handled. Not split: an app that does not speak the
		// batch format would answer every part the same.
		return nil, Result{Outcome: budget.Unknown, Status: a.status, Detail: "batch response unreadable: want {\"results\": [...]}"}, false
	}
	each = make([]Result, len(reqs))
	if inOrder(results, reqs) {
		// The usual answer: one result per event, in the request's order.
		for i := range reqs {
			each[i] = h.eventResult(results[i], a.status, end, 0)
		}
		return each, Result{}, false
	}
	byID := make(map[string]batchResult, len(results))
	for _, r := range results {
		if _, seen := byID[r.ID]; seen {
			r.twice = true // a batch never holds an id twice: which is meant?
		}
		byID[r.ID] = r
	}
	for i, req := range reqs {
		r, ok := byID[wireID(req.EventID)]
		if res, matched := matchResult(ok, r.twice); !matched {
			res.Status = a.status
			each[i] = res
			continue
		}
		each[i] = h.eventResult(r, a.status, end, 0)
	}
	return each, Result{}, false
}

// inOrder reports whether results answer reqs one for one, in order. A
// batch never holds an id twice, so then each event has exactly one answer
// and no look-up by id is needed.
func inOrder(results []batchResult, reqs []*Request) bool {
	if len(results) != len(reqs) {
		return false
	}
	for i, req := range reqs {
		if results[i].ID != wireID(req.EventID) {
			return false
		}
	}
	return true
}

// matchResult is the Result of an event whose answer in a batch response is
// missing or given twice (matched false): unknown, since which answer is
// this event's, or whether the app handled it, cannot be known.
func matchResult(found, twice bool) (res Result, matched bool) {
	switch {
	case !found:
		return Result{Outcome: budget.Unknown, Detail: "the batch response has no result for this event"}, false
	case twice:
		return Result{Outcome: budget.Unknown, Detail: "the batch response has two results for this event"}, false
	}
	return Result{}, true
}

// eventResult classifies one event's answer: its outcome name wins, else its
// status through the same table as single delivery, else success.
func (h *HTTP) eventResult(r batchResult, status int, now time.Time, latency time.Duration) Result {
	res := Result{Outcome: budget.Success, Status: status, Latency: latency}
	if r.Status != 0 {
		res.Status = r.Status
		res.Outcome = h.classifier.Status(r.Status)
	}
	if r.Outcome != "" {
		o, ok := budget.ParseOutcome(strings.ToLower(strings.TrimSpace(r.Outcome)))
		if !ok {
			return Result{Outcome: budget.Unknown, Status: status, Latency: latency,
				Detail: fmt.Sprintf("unknown outcome %q in the batch response", r.Outcome)}
		}
		res.Outcome = o
	}
	if len(r.RetryAfter) > 0 {
		var v any
		if json.Unmarshal(r.RetryAfter, &v) == nil {
			switch v := v.(type) {
			case float64:
				res.RetryAfter = ParseRetryAfter(strconv.FormatInt(int64(v), 10), now)
			case string:
				res.RetryAfter = ParseRetryAfter(v, now)
			}
		}
	}
	if res.Outcome != budget.Success {
		res.Detail = r.Detail
		if res.Detail == "" {
			res.Detail = "batch: " + res.Outcome.String()
		}
		if len(res.Detail) > evidenceLen {
			res.Detail = res.Detail[:evidenceLen]
		}
	}
	return res
}
