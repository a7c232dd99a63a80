package dispatch

import (
	"sync"
	"sync/atomic"
)

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
	wg      sync.WaitGroup
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
	go p.worker(w)
}

func (p *pool) worker(w walk) {
	defer p.wg.Done()
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
		p.idle.Add(-1)
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
