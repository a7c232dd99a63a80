package dispatch

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// poolTrimEvery is how often workers that stayed parked all along exit:
// after a burst the process is back to the goroutines its load needs
// within two periods, as it was when each walk's goroutine ended with it.
const poolTrimEvery = 5 * time.Second

// pool runs walks on goroutines that outlive them. A walk that ends leaves
// its goroutine parked for the next one, its stack already grown to what a
// walk needs: a goroutine started for each delivery grew a fresh stack each
// time, which cost more CPU than anything the walk itself did. Admission
// never waits for a worker: with none parked, the walk gets a goroutine of
// its own, as before, so a walk that waits (for its key, a slot, a due time)
// never holds up the delivery behind it. It is safe for concurrent use.
type pool struct {
	run func(*walk)
	// tasks is unbuffered: a send goes through only to a parked worker.
	// Closed, it makes parked workers exit.
	tasks   chan walk
	idle    atomic.Int32 // workers parked or about to park
	maxIdle int32
	// leastIdle is the fewest workers parked since the last trim: that
	// many were not needed all the while.
	leastIdle atomic.Int32
	workers   atomic.Int32 // alive
	wg        sync.WaitGroup
}

func newPool(run func(*walk), maxIdle int) *pool {
	return &pool{run: run, tasks: make(chan walk), maxIdle: int32(max(maxIdle, 1))}
}

// start runs w on a parked worker, or on a new one.
func (p *pool) start(w walk) {
	select {
	case p.tasks <- w:
		return
	default:
	}
	p.wg.Add(1)
	p.workers.Add(1)
	go p.worker(w)
}

func (p *pool) worker(w walk) {
	defer p.wg.Done()
	defer p.workers.Add(-1)
	for {
		p.run(&w)
		// Past maxIdle parked, a worker is more memory than it saves.
		if p.idle.Add(1) > p.maxIdle {
			p.idle.Add(-1)
			return
		}
		var ok bool
		if w, ok = <-p.tasks; !ok {
			return
		}
		n := p.idle.Add(-1)
		for least := p.leastIdle.Load(); n < least && !p.leastIdle.CompareAndSwap(least, n); least = p.leastIdle.Load() {
		}
		if w.retire {
			return
		}
	}
}

// trim makes as many parked workers exit as stayed parked since the last
// trim.
func (p *pool) trim() {
	n := p.leastIdle.Swap(p.idle.Load())
	for range n {
		select {
		case p.tasks <- walk{retire: true}:
		default:
			return // none parked now
		}
	}
}

// trimmer trims every period until ctx is done; close the pool only after
// it returned.
func (p *pool) trimmer(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.trim()
		}
	}
}

// close makes parked workers exit, and those still walking exit when their
// walk ends; wait says whether to wait for them all. No walk may start
// after it.
func (p *pool) close(wait bool) {
	close(p.tasks)
	if wait {
		p.wg.Wait()
	}
}
