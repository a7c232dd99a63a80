package dispatch

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"handoff.dev/handoff/internal/budget"
)

// freshFailThreshold is the least number of failed first attempts in a row
// (with the retry budget spent) that pauses fresh intake.
const freshFailThreshold = 16

// Probe spacing while fresh intake is paused: one fresh message is let
// through to find out whether the app is back, when no retry tells first.
const (
	freshProbeMin = time.Second
	freshProbeMax = 10 * time.Second
)

// freshGate holds the first attempts of fresh messages while the retry
// budget is spent and they keep failing (see handoff.acquire). While held
// it lets one through now and then as a probe. It is safe for concurrent use.
type freshGate struct {
	log *slog.Logger

	syncMu sync.Mutex // serializes syncFresh

	latch                // held while fresh intake is paused
	closed bool          // after close, hold does nothing
	stop   chan struct{} // ends the prober of the current hold
	probe  chan struct{} // one token: one message through
	wg     sync.WaitGroup
}

func newFreshGate(log *slog.Logger) *freshGate {
	g := &freshGate{log: log, probe: make(chan struct{}, 1)}
	g.init()
	return g
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (g *freshGate) hold(state budget.BudgetState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || !g.holdLocked() {
		return
	}
	g.stop = make(chan struct{})
	g.log.Warn("retry budget spent and fresh messages keep failing: fresh intake paused; retries and probes go on",
		"tokens", state.Tokens, "denied", state.Denied)
	g.wg.Add(1)
	go g.prober(g.stop)
}

func (g *freshGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.openLocked() {
		return
	}
	close(g.stop)
	g.log.Info("a call succeeded: fresh intake resumed")
}

func (g *freshGate) prober(stop chan struct{}) {
	defer g.wg.Done()
	backoff := budget.NewBackoff(freshProbeMin, freshProbeMax)
	for {
		t := time.NewTimer(backoff.Next())
		select {
		case <-t.C:
			select {
			case g.probe <- struct{}{}:
			default:
			}
		case <-stop:
			t.Stop()
			// A probe token left over would let one message past a later
			// hold early; drop it.
			select {
			case <-g.probe:
			default:
			}
			return
		}
	}
}

// close ends any hold and waits for its prober.
func (g *freshGate) close() {
	g.mu.Lock()
	g.closed = true
	if g.openLocked() {
		close(g.stop)
	}
	g.mu.Unlock()
	g.wg.Wait()
}

// watch logs the budget and the concurrency limit when they change, and
// tells sources that share one intake to stop fetching retries while the
// budget is spent, until ctx is done.
func (e *Engine) watch(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	exhausted, limit := false, e.limiter.Limit()
	var lastLog time.Time
	for {
		select {
		case <-ctx.Done():
			if exhausted {
				e.holdRetries(false)
			}
			return
		case <-t.C:
		}
		if l := e.limiter.Limit(); l != limit {
			e.log.Info("concurrency limit changed", "limit", l, "was", limit, "max", e.o.MaxConcurrency, "in_flight", e.limiter.InFlight())
			limit = l
		}
		b := e.o.Budget
		if b == nil {
			continue
		}
		st := b.State()
		now := st.Tokens < 1
		switch {
		case now && !exhausted:
			e.log.Warn("retry budget spent: re-attempts wait for tokens", "tokens", st.Tokens, "denied", st.Denied)
			lastLog = time.Now()
		case !now && exhausted:
			e.log.Info("retry budget has tokens again", "tokens", st.Tokens, "denied", st.Denied)
		case now && time.Since(lastLog) >= 10*time.Second:
			e.log.Info("retry budget still spent", "tokens", st.Tokens, "denied", st.Denied, "fresh_intake_paused", e.intakes.Paused())
			lastLog = time.Now()
		}
		if now != exhausted {
			e.holdRetries(now)
			exhausted = now
		}
	}
}

// syncFresh makes the fresh gate follow the Intake's state. Reading the
// state and moving the gate under one lock means the last change always wins:
// a pause decided just before a success cannot close the gate after it.
func (e *Engine) syncFresh() {
	g := e.fresh
	g.syncMu.Lock()
	defer g.syncMu.Unlock()
	if e.intakes.Paused() {
		var st budget.BudgetState
		if e.o.Budget != nil {
			st = e.o.Budget.State()
		}
		g.hold(st)
	} else {
		g.open()
	}
}

func (e *Engine) holdRetries(hold bool) {
	for _, r := range e.o.Routes {
		for _, src := range r.Sources {
			if h, ok := src.(RetryHolder); ok {
				h.HoldRetries(hold)
			}
		}
	}
}

// observe adapts intake to an answer: a success ends a pause of fresh intake;
// failing first attempts with the budget spent start one; Retry-After on an
// Overload answer holds every call for that long.
func (e *Engine) observe(res budget.Outcome, first bool, retryAfter time.Duration) {
	var exhausted func() bool
	if b := e.o.Budget; b != nil {
		exhausted = b.Exhausted
	}
	if e.intakes.Observe(res, first, exhausted) {
		e.syncFresh()
	}
	if res == budget.Overload && retryAfter > 0 {
		until := e.now().Add(retryAfter).UnixNano()
		for {
			cur := e.overloadUntil.Load()
			if cur >= until {
				break
			}
			if e.overloadUntil.CompareAndSwap(cur, until) {
				e.log.Info("app asked to slow down: every call waits", "retry_after", retryAfter)
				break
			}
		}
	}
}
