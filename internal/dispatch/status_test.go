package dispatch

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/testkit"
)

// heldApp answers every call once release is closed.
type heldApp struct {
	calls   chan struct{}
	release chan struct{}
}

func (a *heldApp) Deliver(ctx context.Context, _ *handler.Request) handler.Result {
	a.calls <- struct{}{}
	select {
	case <-a.release:
	case <-ctx.Done():
	}
	return handler.Result{Outcome: budget.Success}
}

func (a *heldApp) Probe(context.Context) error { return nil }

// Status counts the deliveries and calls in flight, dates the oldest, and
// reads the limiter and the budget; once the calls end, nothing is open.
func TestStatus(t *testing.T) {
	r := newRig(t)
	app := &heldApp{calls: make(chan struct{}, 8), release: make(chan struct{})}
	now := time.Now()
	clock := func() time.Time { return now }
	e := New(Options{
		Routes:         []Route{{Name: "fake", Sources: []Source{&fakeSource{ds: []broker.Delivery{r.delivery("a"), r.delivery("b")}}}, Transfer: r.tr}},
		Handler:        app,
		Policy:         &budget.Policy{MaxAttempts: 3, Deadline: time.Hour, DeferMaxAge: time.Hour, Jitter: func() float64 { return 0 }},
		Journal:        r.journal,
		Timeout:        time.Minute,
		MaxConcurrency: 4,
		DrainTimeout:   time.Second,
		Budget:         budget.NewRetryBudget(0.2, 10, 10*time.Second, nil),
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now:            clock,
	})
	if st := e.Status(); st.InFlight != 0 || st.Limit != 4 || st.Max != 4 || len(st.Routes) != 1 || st.Routes[0].InFlight != 0 || !st.Routes[0].Oldest.IsZero() {
		t.Fatalf("before Run: %+v", st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	<-app.calls
	<-app.calls
	st := e.Status()
	if st.InFlight != 2 || st.Queued != 0 || st.AppUnreachable || st.FreshIntakePaused || !st.OverloadUntil.IsZero() {
		t.Errorf("two calls in flight: %+v", st)
	}
	if rs := st.Routes[0]; rs.Name != "fake" || rs.InFlight != 2 || !rs.Oldest.Equal(now) {
		t.Errorf("route: %+v, want 2 in flight since %v", rs, now)
	}
	if st.Budget == nil || st.Budget.Tokens < 1 || st.Routes[0].RetriesHeld {
		t.Errorf("budget: %+v, retries held %v", st.Budget, st.Routes[0].RetriesHeld)
	}
	close(app.release)
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool {
		st := e.Status()
		return st.InFlight == 0 && st.Routes[0].InFlight == 0 && st.Routes[0].Oldest.IsZero()
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
