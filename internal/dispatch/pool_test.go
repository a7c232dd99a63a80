package dispatch

import (
	"sync"
	"testing"
	"time"

	"handoff.dev/handoff/internal/testkit"
)

// A walk that waits never holds up the one admitted after it, however few
// workers are parked: admission starts a worker rather than wait for one.
func TestPoolNeverWaitsForAWorker(t *testing.T) {
	release := make(chan struct{})
	ran := make(chan uint64, 2)
	p := newPool(func(w *walk) {
		ran <- w.id
		if w.id == 1 {
			<-release
		}
	}, 1)
	p.start(walk{id: 1})
	p.start(walk{id: 2})
	got := map[uint64]bool{}
	for range 2 {
		select {
		case id := <-ran:
			got[id] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("walks run: %v; the second waited for the first", got)
		}
	}
	close(release)
	p.close(true)
}

// Workers are kept for later walks up to maxIdle (the rest exit), and close
// waits for every worker to exit.
func TestPoolKeepsAtMostMaxIdleWorkers(t *testing.T) {
	const n, maxIdle = 8, 3
	var started sync.WaitGroup
	started.Add(n)
	release := make(chan struct{})
	p := newPool(func(w *walk) {
		if w.id < n {
			started.Done()
			<-release
		}
	}, maxIdle)
	for i := range n {
		p.start(walk{id: uint64(i)})
	}
	started.Wait()
	close(release)
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return p.idle.Load() == maxIdle })
	// A parked worker takes the next walk and parks again.
	ran := make(chan struct{})
	p.run = func(*walk) { close(ran) }
	p.start(walk{id: n})
	<-ran
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return p.idle.Load() == maxIdle })
	done := make(chan struct{})
	go func() { p.close(true); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("close did not return: a worker outlived it")
	}
}

// Workers that stay parked from one trim to the next exit; one taken for a
// walk in between is kept, as the load needed it.
func TestPoolTrimRetiresWorkersNotNeeded(t *testing.T) {
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(3)
	p := newPool(func(w *walk) {
		if w.id < 3 {
			started.Done()
			<-release
		}
	}, 8)
	defer p.close(true)
	for i := range 3 {
		p.start(walk{id: uint64(i)})
	}
	started.Wait()
	close(release)
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return p.idle.Load() == 3 })

	p.trim() // the first period began with none parked: none retires
	if n := p.workers.Load(); n != 3 {
		t.Fatalf("%d workers after the first trim, want 3", n)
	}
	ran := make(chan struct{})
	p.run = func(*walk) { ran <- struct{}{} }
	p.start(walk{id: 3}) // one worker is needed in this period
	<-ran
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return p.idle.Load() == 3 })
	p.trim()
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return p.workers.Load() == 1 })
	p.trim()
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return p.workers.Load() == 0 })
}
