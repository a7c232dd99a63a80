package dispatch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
)

// Options configures an Engine.
type Options struct {
	Routes  []Route
	Handler Deliverer
	Policy  *budget.Policy
	// Timeout bounds one attempt; the message's deadline may shorten it.
	Timeout time.Duration
	// MaxConcurrency bounds messages in flight, across all routes.
	MaxConcurrency int
	// DrainTimeout bounds how long in-flight messages may finish after intake
	// stops; the rest are handed back unsettled.
	DrainTimeout time.Duration
	Logger       *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Engine runs the hand-off of every route's messages. Build it with New and
// run it once with Run.
type Engine struct {
	o       Options
	log     *slog.Logger
	now     func() time.Time
	slots   chan struct{}
	gate    *gate
	workers sync.WaitGroup
}

// New returns an engine.
func New(o Options) *Engine {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Engine{
		o:     o,
		log:   o.Logger,
		now:   o.Now,
		slots: make(chan struct{}, max(o.MaxConcurrency, 1)),
		gate:  newGate(o.Handler.Probe, o.Logger),
	}
}

// Ready reports why the engine cannot make progress now, or nil.
func (e *Engine) Ready() error {
	if e.gate.isHeld() {
		return errors.New("app unreachable")
	}
	return nil
}

// Run consumes every route until ctx is done. Then it stops intake, lets
// in-flight messages finish for up to DrainTimeout, hands back the rest
// unsettled, and returns. Adapters must stay open until Run returns: the
// last settles go through them.
func (e *Engine) Run(ctx context.Context) error {
	work, cancelWork := context.WithCancel(context.Background())
	defer cancelWork()
	intake, stopIntake := context.WithCancel(ctx)
	defer stopIntake()

	var wg sync.WaitGroup
	errs := make(chan error, 2*len(e.o.Routes))
	for i := range e.o.Routes {
		r := &e.o.Routes[i]
		for _, in := range []struct {
			src   Source
			retry bool
		}{{r.Fresh, false}, {r.Retry, true}} {
			if in.src == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := in.src.Consume(intake, func(d broker.Delivery) { e.admit(intake, work, r, d, in.retry) })
				if err != nil {
					errs <- err
					stopIntake()
				}
			}()
		}
	}
	wg.Wait()
	stopIntake()

	drained := make(chan struct{})
	go func() { e.workers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(e.o.DrainTimeout):
		e.log.Warn("drain timeout: handing back messages still in flight", "drain_timeout", e.o.DrainTimeout)
		cancelWork()
		<-drained
	}
	cancelWork()
	e.gate.close()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// admit waits for the gate and a concurrency slot, then processes d on its
// own goroutine. Until it has a slot the delivery is not taken: with
// prefetch, that holds the broker back.
func (e *Engine) admit(intake, work context.Context, r *Route, d broker.Delivery, retry bool) {
	if e.gate.wait(intake) != nil {
		e.handBack(d)
		return
	}
	select {
	case e.slots <- struct{}{}:
	case <-intake.Done():
		e.handBack(d)
		return
	}
	e.workers.Add(1)
	go func() {
		defer func() {
			<-e.slots
			e.workers.Done()
		}()
		h := handoff{e: e, r: r, d: d, msg: d.Message(), retry: retry}
		h.run(work)
	}()
}

func (e *Engine) handBack(d broker.Delivery) {
	if err := d.Release(); err != nil {
		e.log.Debug("hand back delivery", "err", err)
	}
}

// defaultCEType is the ce-type of messages that carry none.
const defaultCEType = "handoff.message"

// handoff is the walk of one delivery through the pipeline.
type handoff struct {
	e     *Engine
	r     *Route
	d     broker.Delivery
	msg   *broker.Message
	retry bool
	trail broker.Trail
	log   *slog.Logger
}

func (h *handoff) run(ctx context.Context) {
	e := h.e
	if h.retry {
		t, err := broker.ParseTrail(h.msg.Headers)
		if err != nil {
			id, _ := eventID(h.msg)
			h.trail = broker.Trail{EventID: id, Origin: h.msg.Origin, ErrorClass: "malformed", Error: "unreadable handoff headers: " + err.Error()}
			h.log = e.log.With("source", h.r.Name, "event_id", id)
			h.deadLetter(ctx, budget.ReasonMalformed)
			return
		}
		h.trail = t
	} else {
		id, hashed := eventID(h.msg)
		// Headers a producer set under handoff-* are never read on a
		// message's first entry: the trail starts here.
		h.trail = broker.Trail{EventID: id, Origin: h.msg.Origin}
		if hashed {
			e.log.Warn("message has no id: using a content hash as its event id", "source", h.r.Name, "event_id", id)
		}
	}
	h.log = e.log.With("source", h.r.Name, "event_id", h.trail.EventID)

	now := e.now()
	if h.retry && now.Before(h.trail.NextDue) {
		// Back before its due time (it needed a longer delay than the largest
		// tier): delay again; this is not an attempt.
		dec := e.o.Policy.Redelay(now, h.trail.NextDue)
		h.transferAndSettle(ctx, broker.Destination{Tier: dec.Tier}, "redelay")
		return
	}
	h.attempt(ctx)
}

// attempt calls the app until it answers (holding while it is unreachable)
// and carries out the decision.
func (h *handoff) attempt(ctx context.Context) {
	e, p, t := h.e, h.e.o.Policy, &h.trail
	for {
		now := e.now()
		if t.FirstAttemptAt.IsZero() {
			t.FirstAttemptAt = now
			t.Deadline = p.DeadlineFor(now, time.Time{})
		}
		if !p.CanAttempt(now, t.Deadline) {
			h.deadLetter(ctx, budget.ReasonDeadline)
			return
		}
		req := handler.Request{
			Message:     h.msg,
			EventID:     t.EventID,
			Source:      h.r.CESource,
			Type:        defaultCEType,
			Attempt:     t.Attempt + 1,
			Deadline:    t.Deadline,
			Redelivered: h.msg.Redelivered || t.ErrorClass == budget.Unknown.String(),
			ReplayID:    t.ReplayID,
			Timeout:     min(e.o.Timeout, t.Deadline.Sub(now)),
		}
		res := e.o.Handler.Deliver(ctx, &req)
		if ctx.Err() != nil {
			// Shutdown cut the call short: its result says nothing about the app.
			h.e.handBack(h.d)
			return
		}
		if res.Outcome == budget.Unreachable {
			e.gate.hold(ctx)
			select {
			case <-ctx.Done():
				e.handBack(h.d)
				return
			case <-h.d.Lost():
				h.log.Warn("delivery lost while the app was unreachable; the broker redelivers it")
				return
			case <-waitGate(ctx, e.gate):
			}
			continue
		}
		h.decide(ctx, req.Attempt, res)
		return
	}
}

func waitGate(ctx context.Context, g *gate) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.opened
}

func (h *handoff) decide(ctx context.Context, attempt int, res handler.Result) {
	e, t := h.e, &h.trail
	now := e.now()
	dec := e.o.Policy.Decide(budget.Input{
		Outcome:        res.Outcome,
		Attempt:        attempt,
		Defers:         t.Defers,
		FirstAttemptAt: t.FirstAttemptAt,
		Deadline:       t.Deadline,
		RetryAfter:     res.RetryAfter,
		Now:            now,
	})
	t.Attempt = attempt
	if res.Outcome == budget.Defer {
		t.Defers++
	}
	if res.Outcome != budget.Success && res.Outcome != budget.Drop {
		if t.FirstFailureAt.IsZero() {
			t.FirstFailureAt = now
		}
		t.ErrorClass = res.Outcome.String()
		t.Error = res.Detail
	}
	h.log.Debug("attempt", "attempt", attempt, "outcome", res.Outcome, "status", res.Status,
		"latency", res.Latency, "action", dec.Action)
	switch dec.Action {
	case budget.Ack:
		if res.Outcome == budget.Drop {
			h.log.Info("app dropped message", "attempt", attempt)
		}
		h.settle()
	case budget.Delay:
		t.NextDue = dec.Due
		h.transferAndSettle(ctx, broker.Destination{Tier: dec.Tier}, "retry")
	case budget.DeadLetter:
		h.deadLetter(ctx, dec.Reason)
	default:
		h.log.Error("no action for outcome; handing message back", "outcome", res.Outcome)
		e.handBack(h.d)
	}
}

func (h *handoff) deadLetter(ctx context.Context, reason budget.Reason) {
	h.trail.DeadReason = string(reason)
	h.trail.NextDue = time.Time{}
	h.log.Info("dead-lettering", "reason", reason, "attempt", h.trail.Attempt, "error", h.trail.Error)
	h.transferAndSettle(ctx, broker.Destination{DeadLetter: true}, "dead-letter")
}

// Transfer backoff bounds: a failing transfer is retried for as long as the
// delivery is in hand.
const (
	transferBackoffMin = 100 * time.Millisecond
	transferBackoffMax = 5 * time.Second
)

// transferAndSettle publishes the copy, waits for the broker's confirm, and
// only then settles the source.
func (h *handoff) transferAndSettle(ctx context.Context, dest broker.Destination, why string) {
	trail := h.trail.Headers()
	backoff := transferBackoffMin
	for {
		err := h.r.Transfer.Transfer(ctx, dest, h.msg, trail)
		if err == nil {
			break
		}
		// Ack only after the copy is confirmed: acking first loses the
		// message if the copy never arrives.
		h.log.Warn("transfer failed; source message stays unacked", "to", dest, "why", why, "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			h.e.handBack(h.d)
			return
		case <-h.d.Lost():
			h.log.Warn("delivery lost before its copy was transferred; the broker redelivers it")
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, transferBackoffMax)
	}
	h.settle()
}

func (h *handoff) settle() {
	if err := h.d.Ack(); err != nil {
		h.log.Warn("ack failed; the broker will redeliver", "err", err)
	}
}
