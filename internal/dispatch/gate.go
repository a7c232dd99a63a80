package dispatch

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

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

	mu sync.Mutex
	// opened is closed while the gate is open; replaced under mu, read
	// without it: every admission and call reads it.
	opened atomic.Pointer[chan struct{}]
	held   bool
	wg     sync.WaitGroup
}

func newGate(probe func(context.Context) error, log *slog.Logger, away, back string) *gate {
	g := &gate{probe: probe, log: log, min: 50 * time.Millisecond, max: 5 * time.Second, away: away, back: back}
	opened := make(chan struct{})
	close(opened)
	g.opened.Store(&opened)
	return g
}

// openChan is closed while the gate is open.
func (g *gate) openChan() <-chan struct{} {
	return *g.opened.Load()
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

// isHeld reports whether the gate is held.
func (g *gate) isHeld() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// hold closes the gate, if open, and starts probing; the prober stops when the
// app answers or ctx is done.
func (g *gate) hold(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held {
		return
	}
	g.held = true
	opened := make(chan struct{})
	g.opened.Store(&opened)
	g.log.Warn(g.away + ": intake paused, probing")
	g.wg.Add(1)
	go g.run(ctx)
}

func (g *gate) run(ctx context.Context) {
	defer g.wg.Done()
	backoff := g.min
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := g.probe(pctx)
		cancel()
		if err == nil {
			g.mu.Lock()
			g.held = false
			close(*g.opened.Load())
			g.mu.Unlock()
			g.log.Info(g.back+": intake resumed", "held_for", time.Since(start).Round(time.Millisecond))
			return
		}
		backoff = min(backoff*2, g.max)
	}
}

// close waits for the prober to stop; cancel its ctx first.
func (g *gate) close() { g.wg.Wait() }
