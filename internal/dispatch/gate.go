package dispatch

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"handoff.dev/handoff/internal/budget"
)

// latch is what both gates are: open or held. Waiters read its channel,
// closed while it is open; the channel is replaced under mu and read without
// it, since every admission and call reads it.
type latch struct {
	mu     sync.Mutex
	opened atomic.Pointer[chan struct{}]
	held   bool
}

func (l *latch) init() {
	opened := make(chan struct{})
	close(opened)
	l.opened.Store(&opened)
}

// openChan is closed while the latch is open.
func (l *latch) openChan() <-chan struct{} { return *l.opened.Load() }

// holdLocked holds the latch and reports whether it was open; mu is held.
func (l *latch) holdLocked() bool {
	if l.held {
		return false
	}
	l.held = true
	opened := make(chan struct{})
	l.opened.Store(&opened)
	return true
}

// openLocked opens the latch and reports whether it was held; mu is held.
func (l *latch) openLocked() bool {
	if !l.held {
		return false
	}
	l.held = false
	close(*l.opened.Load())
	return true
}

// isHeld reports whether the latch is held.
func (l *latch) isHeld() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// gate holds intake and calls while something they need is away: the app
// unreachable, the journal unwritable. While held, a prober tries it with
// backoff and opens the gate when it answers. It is safe for concurrent use.
type gate struct {
	probe    func(context.Context) error
	log      *slog.Logger
	min, max time.Duration
	// what is away, for the log: "app unreachable", "journal cannot be
	// written"; and what it is once back.
	away, back string

	latch
	wg sync.WaitGroup
}

func newGate(probe func(context.Context) error, log *slog.Logger, away, back string) *gate {
	g := &gate{probe: probe, log: log, min: 50 * time.Millisecond, max: 5 * time.Second, away: away, back: back}
	g.init()
	return g
}

// wait blocks while the gate is held, until ctx is done.
func (g *gate) wait(ctx context.Context) error {
	open := g.openChan()
	if isClosed(open) {
		// Read without the channel's lock, which a select takes.
		return nil
	}
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hold closes the gate, if open, and starts probing; the prober stops when the
// app answers or ctx is done.
func (g *gate) hold(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.holdLocked() {
		return
	}
	g.log.Warn(g.away + ": intake paused, probing")
	g.wg.Add(1)
	go g.run(ctx)
}

func (g *gate) run(ctx context.Context) {
	defer g.wg.Done()
	backoff := budget.NewBackoff(g.min, g.max)
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff.Next()):
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := g.probe(pctx)
		cancel()
		if err == nil {
			g.mu.Lock()
			g.openLocked()
			g.mu.Unlock()
			g.log.Info(g.back+": intake resumed", "held_for", time.Since(start).Round(time.Millisecond))
			return
		}
	}
}

// close waits for the prober to stop; cancel its ctx first.
func (g *gate) close() { g.wg.Wait() }
