package handler

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
)

// heldApp answers 200 at once, except while hold is set: then it keeps
// each request (telling arrived) until its client goes away or free is
// called, which the test's end does too.
type heldApp struct {
	url     string
	hold    atomic.Bool
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

// newHeldApp starts a heldApp that holds requests, n at most at once.
func newHeldApp(t *testing.T, n int) *heldApp {
	t.Helper()
	a := &heldApp{arrived: make(chan struct{}, n), release: make(chan struct{})}
	a.hold.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.hold.Load() {
			a.arrived <- struct{}{}
			select {
			case <-r.Context().Done():
			case <-a.release:
			}
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(a.free) // before the server's close, which waits for its requests
	a.url = srv.URL
	return a
}

// free lets every held request go.
func (a *heldApp) free() { a.once.Do(func() { close(a.release) }) }

// Calls under one context share one watch: when the context ends, every
// call in flight is broken off, and the next calls, under another
// context, go through on the same client.
func TestCallsUnderOneContextAreBrokenOffTogether(t *testing.T) {
	const n = 12
	app := newHeldApp(t, n)
	h := newClient(t, app.url, n)

	ctx, cancel := context.WithCancel(context.Background())
	results := make(chan Result, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := request(&broker.Message{})
			r.Timeout = time.Minute
			results <- h.Deliver(ctx, r)
		}()
	}
	for range n {
		<-app.arrived // every call is with the app
	}
	if w := h.watching.Load(); w == nil || w.n != n {
		t.Fatalf("watch holds %v calls, want %d", w, n)
	}
	cancel()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("calls not broken off when their context ended")
	}
	close(results)
	for res := range results {
		if res.Outcome != budget.Unknown {
			t.Errorf("broken-off call's outcome %v, want unknown: the app had the request", res.Outcome)
		}
	}
	if w := h.watching.Load(); w != nil && w.ctx == ctx {
		t.Error("the ended context's watch is still the client's")
	}

	app.hold.Store(false)
	for range 3 {
		if res := h.Deliver(context.Background(), request(&broker.Message{})); res.Outcome != budget.Success {
			t.Fatalf("call after the break-off: %v (%s)", res.Outcome, res.Detail)
		}
		ctx2, cancel2 := context.WithCancel(context.Background())
		res := h.Deliver(ctx2, request(&broker.Message{}))
		cancel2()
		if res.Outcome != budget.Success {
			t.Fatalf("call under a new context: %v (%s)", res.Outcome, res.Detail)
		}
	}
}

// A watch replaced by another context's lets go of its context once its
// last call leaves: a client called under many contexts holds none of
// them.
func TestReplacedWatchLetsGoOfItsContext(t *testing.T) {
	app := newHeldApp(t, 2)
	app.hold.Store(false)
	h := newClient(t, app.url, 2)

	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	if res := h.Deliver(ctx1, request(&broker.Message{})); res.Outcome != budget.Success {
		t.Fatalf("first call: %v (%s)", res.Outcome, res.Detail)
	}
	w1 := h.watching.Load()
	if w1 == nil || w1.ctx != ctx1 || w1.n != 0 {
		t.Fatalf("after the first call the watch is %+v", w1)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	if res := h.Deliver(ctx2, request(&broker.Message{})); res.Outcome != budget.Success {
		t.Fatalf("second call: %v (%s)", res.Outcome, res.Detail)
	}
	if w := h.watching.Load(); w == w1 || w.ctx != ctx2 {
		t.Fatal("the second context's call did not get a watch of its own")
	}
	if w1.stop() { // true: it was registered until now
		t.Error("the replaced watch was still registered with its context")
	}
}

// Calls under contexts of their own (a batch's each) replace each other's
// watch as they start; a call whose watch was replaced is still broken off
// when its own context ends, and the others are not.
func TestCallsUnderContextsOfTheirOwn(t *testing.T) {
	const n = 8
	app := newHeldApp(t, n)
	h := newClient(t, app.url, n)

	cancels := make([]context.CancelFunc, n)
	results := make([]chan Result, n)
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i], results[i] = cancel, make(chan Result, 1)
		go func() {
			r := request(&broker.Message{})
			r.Timeout = time.Minute
			results[i] <- h.Deliver(ctx, r)
		}()
	}
	for range n {
		<-app.arrived
	}
	for i := 0; i < n; i += 2 {
		cancels[i]()
	}
	for i := 0; i < n; i += 2 {
		select {
		case res := <-results[i]:
			if res.Outcome != budget.Unknown {
				t.Errorf("call %d, broken off: %v, want unknown", i, res.Outcome)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d not broken off when its context ended", i)
		}
	}
	app.free()
	for i := 1; i < n; i += 2 {
		if res := <-results[i]; res.Outcome != budget.Success {
			t.Errorf("call %d, whose context lives on: %v (%s), want success", i, res.Outcome, res.Detail)
		}
		cancels[i]()
	}
}
