package dispatch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/journal"
)

// handBackTimeout bounds the wait for hand-offs to stop once cancelled.
const handBackTimeout = 10 * time.Second

// Options configures an Engine.
type Options struct {
	Routes  []Route
	Handler Deliverer
	Policy  *budget.Policy
	// Timeout bounds one attempt; the message's deadline may shorten it.
	Timeout time.Duration
	// MaxConcurrency bounds calls to the app in flight, across all routes.
	// Journal writes, transfers and acks happen outside it, so a slow fsync
	// or broker confirm never idles the app.
	MaxConcurrency int
	// DrainTimeout bounds how long in-flight messages may finish after intake
	// stops; the rest are handed back unsettled.
	DrainTimeout time.Duration
	Logger       *slog.Logger
	// Journal records every hand-off; required.
	Journal Journal
	// Budget is the retry budget shared by every route; nil means
	// re-attempts are not limited.
	Budget *budget.RetryBudget
	// TrustProducerDeadline lets a message's handoff-deadline header shorten
	// (never extend) its deadline on its first entry.
	TrustProducerDeadline bool
	// MaxMessageBytes bounds a body handed to the app: a larger message is
	// dead-lettered, reason too-large. Zero means no bound.
	MaxMessageBytes int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Replayed, when set, is told that the app handled a replayed copy (its
	// trail names the dead letter it replays, Trail.ReplayOf), before its
	// delivery is acked: the receiver records the outcome, and a crash
	// before the ack leaves a redelivery, which is settled as handled and
	// reported again. One copy may therefore be reported more than once. A
	// copy moved to a retry tier or the dead-letter destination is not
	// reported (its next hop is). It is called on the hand-off's goroutine
	// and the ack waits for it: it must return within its own bound.
	Replayed func(ctx context.Context, route string, t broker.Trail)
	// Observer is told what the engine does, for metrics; nil tells no one.
	Observer Observer
	// Tracer, when set, makes a span of each attempt (see startAttempt);
	// nil turns tracing off.
	Tracer trace.Tracer
	// Fault, when set, is called at each crash window of a hand-off (see the
	// Window constants); a non-nil error stops that hand-off right there, as
	// a crash would, leaving the delivery unsettled. Tests use it.
	Fault func(w Window, k journal.Key) error
}

// Engine runs the hand-off of every route's messages. Build it with New and
// run it once with Run.
type Engine struct {
	o       Options
	log     *slog.Logger
	now     func() time.Time
	limiter *budget.Limiter // adaptive bound on calls in flight
	intakes *budget.Intake  // when fresh intake pauses
	fresh   *freshGate
	// overloadUntil (unix nanoseconds) holds every call after an Overload
	// answer with Retry-After.
	overloadUntil atomic.Int64
	gate          *gate
	// jgate holds intake while the journal cannot be written (no room).
	jgate   *gate
	keys    *keyLocks
	order   *sequencer
	workers sync.WaitGroup // walks not yet ended
	pool    *pool
	open    map[string]*openSet // by route: deliveries taken, for Status
	// later is the journal's AppendThen, when it has one: a walk whose
	// answer is a success hands its ack over to the commit instead of
	// parking until the outcome is durable (see handoff.settleLater).
	later laterJournal
	// async is the deliverer's DeliverThen, when it has one and a walk's
	// success can be settled without waiting (later, and no spans): the
	// walk's goroutine does not wait on the call (see Answered).
	async asyncDeliverer
	// iso makes the calls of messages suspected of stopping the sidecar
	// alone (isolation.go).
	iso *isolation

	fatalMu    sync.Mutex
	fatal      error
	stopIntake context.CancelFunc
}

// New returns an engine.
func New(o Options) *Engine {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Observer == nil {
		o.Observer = noObserver{}
	}
	e := &Engine{
		o:       o,
		iso:     newIsolation(),
		log:     o.Logger,
		now:     o.Now,
		limiter: budget.NewLimiter(o.MaxConcurrency),
		intakes: budget.NewIntake(max(o.MaxConcurrency, freshFailThreshold)),
		fresh:   newFreshGate(o.Logger),
		gate:    newGate(o.Handler.Probe, o.Logger, "app unreachable", "app reachable again"),
		jgate:   newGate(o.Journal.Probe, o.Logger, "journal cannot be written", "journal writable again"),
		keys:    newKeyLocks(),
		order:   newSequencer(),
		open:    openSets(o.Routes),
	}
	e.later, _ = o.Journal.(laterJournal)
	e.async = asyncOf(o, e.later)
	// As many parked workers as a burst of walks may want at once: the
	// calls in flight and the deliveries waiting behind them.
	e.pool = newPool(e.walk, 4*max(o.MaxConcurrency, 16))
	return e
}

// asyncOf is o's deliverer as an asyncDeliverer, when it is one and a
// walk's success can be settled without waiting for anything: the journal
// calls back once the outcome is durable (later), and there are no spans
// for the commit to be made under.
func asyncOf(o Options, later laterJournal) asyncDeliverer {
	if a, ok := o.Handler.(asyncDeliverer); ok && later != nil && o.Tracer == nil {
		return a
	}
	return nil
}

func openSets(routes []Route) map[string]*openSet {
	m := make(map[string]*openSet, len(routes))
	for _, r := range routes {
		m[r.Name] = newOpenSet()
	}
	return m
}

// Ready reports why the engine cannot make progress now, or nil.
func (e *Engine) Ready() error {
	if err := e.fatalErr(); err != nil {
		return err
	}
	if e.gate.isHeld() {
		return errors.New("app unreachable")
	}
	return nil
}

// journalCannotWrite holds intake and calls until the journal can be
// written again: a hand-off whose record could not be written is handed
// back, never acked, and more calls would only give the app work whose
// answers cannot be kept.
func (e *Engine) journalCannotWrite(ctx context.Context) {
	e.jgate.hold(ctx)
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
	e.fatalMu.Lock()
	e.stopIntake = stopIntake
	e.fatalMu.Unlock()

	watched := make(chan struct{})
	go func() { defer close(watched); e.watch(work) }()
	defer func() { cancelWork(); <-watched }()
	trimmed := make(chan struct{})
	go func() { defer close(trimmed); e.pool.trimmer(work, poolTrimEvery) }()

	var wg sync.WaitGroup
	n := 0
	for _, r := range e.o.Routes {
		n += len(r.Sources)
	}
	errs := make(chan error, n)
	for i := range e.o.Routes {
		r := &e.o.Routes[i]
		for _, src := range r.Sources {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var queued *budget.Waiter // the source's place in the limiter's queue (admitSlot)
				err := src.Consume(intake, func(d broker.Delivery) { e.admit(intake, work, r, d, &queued) })
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
	stuck := false
	select {
	case <-drained:
	case <-time.After(e.o.DrainTimeout):
		e.log.Warn("drain timeout: handing back messages still in flight", "drain_timeout", e.o.DrainTimeout)
		cancelWork()
		select {
		case <-drained:
		case <-time.After(handBackTimeout):
			// A call into a broker that blocks without end (a blocked
			// connection) must not hold shutdown forever; what is unsettled
			// goes back to the broker with the connection.
			e.log.Error("hand-offs still stuck after being cancelled; stopping without them", "waited", handBackTimeout)
			stuck = true
		}
	}
	cancelWork()
	<-trimmed // its sends must end before the pool closes
	e.pool.close(!stuck)
	e.gate.close()
	e.jgate.close()
	e.fresh.close()
	if err := e.fatalErr(); err != nil {
		return err
	}
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// fail stops the engine as a crash would: intake stops, hand-offs stop where
// they are, and Run returns err. Deliveries left unsettled go back to the
// broker when its connection closes.
func (e *Engine) fail(err error) {
	e.fatalMu.Lock()
	defer e.fatalMu.Unlock()
	if e.fatal != nil {
		return
	}
	e.fatal = err
	e.log.Error("stopping: the hand-off cannot continue safely", "err", err)
	if e.stopIntake != nil {
		e.stopIntake()
	}
}

func (e *Engine) fatalErr() error {
	e.fatalMu.Lock()
	defer e.fatalMu.Unlock()
	return e.fatal
}

// admit waits while the gate is held, then starts the walk of d, on a
// worker of its own. While intake waits, deliveries are not taken: with
// prefetch, that holds the broker back. The number of walks in flight is
// bounded by the sources' prefetch; the calls to the app among them by the
// adaptive limit (see handoff.acquire). A plain first delivery also waits
// here for its call's slot (admitSlot), as a hand-written consumer's
// workers do: its walk starts only when it can call.
func (e *Engine) admit(intake, work context.Context, r *Route, d broker.Delivery, queued **budget.Waiter) {
	if e.gate.wait(intake) != nil || e.jgate.wait(intake) != nil {
		e.handBack(d)
		return
	}
	msg := d.Message()
	if msg.Copy && e.o.Budget != nil && !r.RetriesShareIntake {
		// A copy waits for a token before it is taken, so the retry
		// consumer stops taking deliveries while the budget is spent.
		if !e.o.Budget.Available(intake.Done()) {
			e.handBack(d)
			return
		}
	}
	slot := false
	if !msg.Copy && msg.OrderKey == "" && !msg.FinalDelivery {
		var ok bool
		if slot, ok = e.admitSlot(intake, d, queued); !ok {
			return
		}
	}
	w := walk{r: r, d: d, msg: msg, intake: intake, work: work, open: e.open[r.Name], final: msg.FinalDelivery, slot: slot}
	if w.final {
		e.iso.finalIn()
	}
	if msg.OrderKey != "" {
		w.wait, w.leave = e.order.enter(msg.OrderKey)
	}
	e.workers.Add(1)
	w.id = w.open.enter(e.now())
	e.pool.start(w)
}

// admitSlot takes a slot for the first call of a delivery about to be
// admitted, waiting for one in the limiter's queue, on the source's
// goroutine: slot says it holds one, which its walk's first attempt uses
// (see handoff.acquire) or gives back. Queued there, the source takes no
// more deliveries, and the walks waiting for a slot are not each a parked
// goroutine with a waiter of its own: the source is the one waiter. No
// slot is taken while first attempts are paused or an Overload answer
// holds calls: the walk waits in acquire, as every walk did before. ok is
// false when the delivery was handed back (intake stopped) or lost.
//
// Only a delivery whose walk goes straight to its call takes it: a copy
// waits for a budget token first, a delivery in a sequence for its turn,
// and one on its final count makes no call. A walk that turns out to wait
// for something else before its call (its event's lock, a due time) or to
// make none gives the slot back first (handoff.dropSlot), so no slot is
// held by a walk waiting on another walk.
func (e *Engine) admitSlot(intake context.Context, d broker.Delivery, queued **budget.Waiter) (slot, ok bool) {
	if !isClosed(e.fresh.openChan()) || e.overloadUntil.Load() != 0 {
		return false, true
	}
	// One source waits for one slot at a time: its place in the queue is
	// one waiter, reused, not one made for each wait.
	w := *queued
	if w == nil {
		w = e.limiter.NewWaiter()
		*queued = w
	}
	if e.limiter.AcquireAgain(w) {
		return true, true
	}
	select {
	case <-w.Ready():
		return true, true
	case <-intake.Done():
		e.handBack(d)
	case <-d.Lost():
	}
	w.Cancel()
	*queued = nil // a cancelled waiter is not queued again
	return false, false
}

// walk is one delivery admitted, and what its walk needs from admission.
type walk struct {
	r            *Route
	d            broker.Delivery
	msg          *broker.Message
	intake, work context.Context
	open         *openSet
	id           uint64 // in open
	// wait, when not nil, is closed once the walk before it in its
	// sequence ends; leave ends this one's turn.
	wait  <-chan struct{}
	leave func()
	// retire: no walk; the parked worker that takes it exits (pool.trim).
	retire bool
	// final: the delivery is on its final count, counted in e.iso.
	final bool
	// slot: admission took a slot for its first call (admitSlot).
	slot bool
}

// walk runs w's hand-off once its turn in its sequence comes.
func (e *Engine) walk(w *walk) {
	if w.wait != nil {
		select {
		case <-w.wait:
		case <-w.work.Done():
			e.handBack(w.d)
			e.walkEnded(w.leave, w.open, w.id, w.final)
			return
		case <-w.d.Lost():
			e.walkEnded(w.leave, w.open, w.id, w.final)
			return
		}
	}

	ws := newWalkState()
	h := &ws.h
	*h = handoff{e: e, r: w.r, d: w.d, msg: w.msg, retry: w.msg.Copy, intake: w.intake,
		leave: w.leave, openSet: w.open, openID: w.id, final: w.final, slot: w.slot, space: &ws.space, room: ws.space.recs[:], state: ws}
	if h.run(w.work) {
		return // the call's answer ends the walk (Answered)
	}
	h.walkOver(ws)
}

// walkOver is the end of the part of a walk its goroutine had: the walk
// ends, unless the journal's commit ends it (settleLater), and ws is let go.
func (h *handoff) walkOver(ws *walkState) {
	h.dropSlot() // a walk that ended before its call
	if !h.later {
		h.ended()
	}
	ws.release()
}

// walkEnded ends a walk's turn in its sequence, takes it out of the open
// set and counts it ended: the last of a walk, whichever goroutine ends it.
func (e *Engine) walkEnded(leave func(), open *openSet, id uint64, final bool) {
	if leave != nil {
		leave()
	}
	if final {
		e.iso.finalOut()
	}
	open.leave(id)
	e.workers.Done()
}

func (e *Engine) handBack(d broker.Delivery) {
	if err := d.Release(); err != nil {
		e.log.Debug("hand back delivery", "err", err)
	}
}
