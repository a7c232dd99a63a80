package dispatch

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/testkit"
)

// scriptApp answers every call with whatever answer holds now.
type scriptApp struct {
	answer   atomic.Value // handler.Result
	delay    time.Duration
	mu       sync.Mutex
	calls    []time.Time
	attempts map[string][]int
	inFlight atomic.Int32
}

func newScriptApp(res handler.Result, delay time.Duration) *scriptApp {
	a := &scriptApp{delay: delay, attempts: map[string][]int{}}
	a.answer.Store(res)
	return a
}

func (a *scriptApp) Deliver(ctx context.Context, r *handler.Request) handler.Result {
	a.inFlight.Add(1)
	defer a.inFlight.Add(-1)
	a.mu.Lock()
	a.calls = append(a.calls, time.Now())
	a.attempts[r.EventID] = append(a.attempts[r.EventID], r.Attempt)
	a.mu.Unlock()
	select {
	case <-time.After(a.delay):
	case <-ctx.Done():
	}
	return a.answer.Load().(handler.Result)
}

func (a *scriptApp) Probe(context.Context) error { return nil }

func (a *scriptApp) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.calls)
}

func (r *rig) engineWith(app Deliverer, o func(*Options), ds ...broker.Delivery) *Engine {
	e := r.engine(32, ds...)
	e.o.Handler = app
	e.gate = newGate(app.Probe, e.log, "app unreachable", "app reachable again")
	if o != nil {
		o(&e.o)
	}
	e.async = asyncOf(e.o, e.later)
	return e
}

func TestAdaptiveLimitShrinksUnderOverloadAndRecovers(t *testing.T) {
	r := newRig(t)
	app := newScriptApp(handler.Result{Outcome: budget.Overload, Detail: "429"}, time.Millisecond)
	var ds []broker.Delivery
	for i := range 3000 {
		ds = append(ds, r.delivery(fmt.Sprint("m", i)))
	}
	e := r.engineWith(app, nil, ds...)
	var minLimit atomic.Int32
	minLimit.Store(32)
	recovered := false
	run(t, e, func() bool {
		l := int32(e.limiter.Limit())
		if l < minLimit.Load() {
			minLimit.Store(l)
		}
		if minLimit.Load() <= 2 && app.answer.Load().(handler.Result).Outcome == budget.Overload {
			app.answer.Store(handler.Result{Outcome: budget.Success})
		}
		recovered = minLimit.Load() <= 2 && l == 32
		return recovered
	})
	if minLimit.Load() > 2 {
		t.Fatalf("limit under 429s fell only to %d, want 1 or 2", minLimit.Load())
	}
	if !recovered {
		t.Fatalf("limit did not recover to 32 after successes: %d", e.limiter.Limit())
	}
}

func TestRetryAfterHoldsEveryCall(t *testing.T) {
	r := newRig(t)
	app := newScriptApp(handler.Result{Outcome: budget.Overload, RetryAfter: 400 * time.Millisecond}, 0)
	first, second := r.delivery("first"), r.delivery("second")
	e := r.engineWith(app, func(o *Options) { o.MaxConcurrency = 1 }, first)
	e.limiter = budget.NewLimiter(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	src := &chanSource{ch: make(chan broker.Delivery, 2)}
	e.o.Routes[0].Sources = []Source{src}
	go func() { done <- e.Run(ctx) }()
	src.ch <- first
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return app.count() == 1 })
	app.answer.Store(handler.Result{Outcome: budget.Success})
	src.ch <- second
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return app.count() == 2 })
	cancel()
	<-done
	app.mu.Lock()
	gap := app.calls[1].Sub(app.calls[0])
	app.mu.Unlock()
	if gap < 400*time.Millisecond {
		t.Errorf("the next call came %v after a 429 with Retry-After 0.4s, want >= 400ms", gap)
	}
}

// chanSource hands out what arrives on ch.
type chanSource struct{ ch chan broker.Delivery }

func (s *chanSource) Consume(ctx context.Context, deliver func(broker.Delivery)) error {
	for {
		select {
		case d := <-s.ch:
			deliver(d)
		case <-ctx.Done():
			return nil
		}
	}
}

// testClock is an engine clock that moves only when told to.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func TestReattemptWaitsForATokenUntilItsDeadline(t *testing.T) {
	r := newRig(t)
	app := newScriptApp(handler.Result{Outcome: budget.Retry}, 0)
	d := r.delivery("a")
	start := time.Now()
	e := r.engineWith(app, func(o *Options) {
		o.Budget = budget.NewRetryBudget(0, 0, time.Second, nil)
		o.Routes[0].InPlace = true
		// Due after the 1s tier, then no token until the deadline.
		o.Policy.Deadline = 1500 * time.Millisecond
		o.Policy.MaxAttempts = 100
	}, d)
	run(t, e, func() bool {
		ev := r.snapshot()
		return len(ev) >= 2
	})
	ev := r.snapshot()
	if len(ev) != 2 || ev[0].kind != "transfer" || !ev[0].dest.DeadLetter || ev[1].kind != "ack" {
		t.Fatalf("events = %v, want a dead-letter copy and an ack", kinds(ev))
	}
	if n := app.count(); n != 1 {
		t.Errorf("app called %d times, want 1: no token for a re-attempt", n)
	}
	if took := time.Since(start); took < 1400*time.Millisecond {
		t.Errorf("dead-lettered after %v: the re-attempt must wait for a token until its deadline", took)
	}
	if st := e.o.Budget.State(); st.Denied == 0 {
		t.Error("no denial counted")
	}
}

func TestProducerDeadlineOnlyWhenTrusted(t *testing.T) {
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	for _, trust := range []bool{false, true} {
		r := newRig(t)
		app := newScriptApp(handler.Result{Outcome: budget.Success}, 0)
		d := r.delivery("a")
		d.msg.Headers = broker.Headers{broker.HeaderDeadline: past}
		e := r.engineWith(app, func(o *Options) { o.TrustProducerDeadline = trust }, d)
		run(t, e, func() bool { return len(r.snapshot()) > 0 && r.snapshot()[len(r.snapshot())-1].kind == "ack" })
		calls := app.count()
		ev := r.snapshot()
		deadLettered := len(ev) > 0 && ev[0].kind == "transfer" && ev[0].dest.DeadLetter
		if trust && (calls != 0 || !deadLettered) {
			t.Errorf("trusted past deadline: %d calls, events %v; want no call and a dead letter", calls, kinds(ev))
		}
		if !trust && (calls != 1 || deadLettered) {
			t.Errorf("untrusted deadline header: %d calls, events %v; want it ignored and one call", calls, kinds(ev))
		}
	}
}

func TestFreshIntakePausesWhenBudgetSpentAndFailing(t *testing.T) {
	r := newRig(t)
	app := newScriptApp(handler.Result{Outcome: budget.Retry}, time.Millisecond)
	var ds []broker.Delivery
	for i := range 100 {
		ds = append(ds, r.delivery("m"+string(rune('A'+i%26))+string(rune('A'+i/26))))
	}
	e := r.engineWith(app, func(o *Options) {
		o.Budget = budget.NewRetryBudget(0, 0, time.Second, nil)
		o.MaxConcurrency = 2
	}, ds...)
	e.limiter = budget.NewLimiter(2)
	e.intakes = budget.NewIntake(freshFailThreshold)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testkit.Eventually(t, 30*time.Second, "the condition", e.intakes.Paused)
	// Then a bounded look at what the pause lets through: the threshold,
	// plus calls already holding or about to take a slot while the pause
	// was decided; far fewer than the 100 waiting. (The first probe comes
	// only after freshProbeMin.)
	time.Sleep(200 * time.Millisecond)
	paused := app.count()
	if paused > freshFailThreshold+8 || !e.intakes.Paused() {
		t.Fatalf("%d fresh messages called with the budget spent (paused: %v); want intake paused after %d",
			paused, e.intakes.Paused(), freshFailThreshold)
	}
	// The app recovers: the next probe succeeds and intake resumes.
	app.answer.Store(handler.Result{Outcome: budget.Success})
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return app.count() >= 100 })
	if e.intakes.Paused() {
		t.Error("intake still paused after a success")
	}
}

// Deliveries waiting for a call slot when intake stops are handed back, and
// take no slot with them: the one call in flight finishes, and after it none
// is counted as taken. (The second waits at admission, and the source takes
// the third only once intake has stopped.)
func TestQueuedWalksHandedBackTakeNoSlot(t *testing.T) {
	r := newRig(t)
	app := newScriptApp(handler.Result{Outcome: budget.Success}, 100*time.Millisecond)
	first, second, third := r.delivery("first"), r.delivery("second"), r.delivery("third")
	// A drain long enough for the call in flight on a loaded machine: the
	// queued walks are handed back when intake stops, not when it ends.
	e := r.engineWith(app, func(o *Options) { o.MaxConcurrency, o.DrainTimeout = 1, 10*time.Second }, first, second, third)
	e.limiter = budget.NewLimiter(1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	testkit.Eventually(t, 30*time.Second, "the second queued at admission", func() bool { return app.count() == 1 && e.limiter.Queued() == 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, ev := range r.snapshot() {
		kinds[ev.kind]++
	}
	if app.count() != 1 || kinds["ack"] != 1 || kinds["release"] != 2 {
		t.Fatalf("calls %d, events %v; want the one call acked and the two queued handed back", app.count(), kinds)
	}
	if n := e.limiter.InFlight(); n != 0 {
		t.Fatalf("%d call slots still taken after every walk ended", n)
	}
	// No call was made for the two handed back, whichever two they were:
	// the journal holds no attempt of theirs, so their redelivery is a first
	// attempt, not one whose outcome is unknown. (A waited Append commits
	// every record queued before it.)
	if err := r.journal.Append(context.Background(), journal.Key{Source: "fake", EventID: "flush"}, journal.Record{Kind: journal.Received}); err != nil {
		t.Fatal(err)
	}
	app.mu.Lock()
	called := app.attempts
	app.mu.Unlock()
	for _, id := range []string{"first", "second", "third"} {
		if len(called[id]) > 0 {
			continue // the one called
		}
		st, err := r.journal.State(journal.Key{Source: "fake", EventID: id})
		if err != nil {
			t.Fatal(err)
		}
		if st.Attempts != 0 || st.HopAttempt != 0 {
			t.Errorf("%s, handed back before its call: journal holds attempt %d (hop attempt %d), want none", id, st.Attempts, st.HopAttempt)
		}
	}
}

// A slot that comes to a queued walk as a Retry-After pause begins is given
// back: while the pause lasts no slot is held, and the walk calls after it.
func TestSlotGivenBackWhenAPauseBegins(t *testing.T) {
	r := newRig(t)
	app := newScriptApp(handler.Result{Outcome: budget.Overload, RetryAfter: 400 * time.Millisecond}, 50*time.Millisecond)
	first, second := r.delivery("first"), r.delivery("second")
	// The pause ends by the engine's clock, which moves only when the test
	// says: however slow the machine, the checks below are inside it.
	clock := newTestClock()
	e := r.engineWith(app, func(o *Options) { o.MaxConcurrency = 1 }, first, second)
	e.limiter, e.now = budget.NewLimiter(1), clock.Now
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// The first is in its call and the second queued behind it; the first
	// answers 429, and its slot goes to the second as the pause begins.
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return app.count() == 1 && e.limiter.Queued() == 1 })
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return e.overloadUntil.Load() != 0 })
	app.answer.Store(handler.Result{Outcome: budget.Success})
	// The second walk gives its slot back and nothing queues: it waits out
	// the pause holding no slot.
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return e.limiter.InFlight() == 0 && e.limiter.Queued() == 0 })
	if q := app.count(); q != 1 {
		t.Fatalf("during the pause: %d calls; want only the first call", q)
	}
	clock.Advance(time.Second) // past the pause
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool { return app.count() >= 2 })
}

// A re-attempt whose deadline passes while it waits for a call slot is
// dead-lettered when the slot comes, not called. (A copy's walk queues for
// its slot itself; a first delivery waits at admission, before its
// deadline starts: TestFirstDeliveryWaitsForItsSlotAtAdmission.)
func TestDeadlinePassedInTheQueue(t *testing.T) {
	r := newRig(t)
	app := newScriptApp(handler.Result{Outcome: budget.Success}, 0)
	clock := newTestClock()
	late := r.delivery("late")
	late.msg.Copy = true
	tr := broker.Trail{EventID: "late", Attempt: 1, Hops: 1, FirstAttemptAt: clock.Now(), Deadline: clock.Now().Add(100 * time.Millisecond)}
	late.msg.Headers = tr.Headers()
	e := r.engineWith(app, func(o *Options) { o.MaxConcurrency = 1 }, late)
	e.limiter, e.now = budget.NewLimiter(1), clock.Now
	defer runHoldingTheSlot(t, e)()
	testkit.Eventually(t, 30*time.Second, "the copy's walk queued for a slot", func() bool {
		return e.limiter.Queued() == 1 && e.Status().Routes[0].InFlight == 1
	})
	clock.Advance(150 * time.Millisecond) // past the walk's deadline
	e.limiter.Release(0)
	testkit.Eventually(t, 30*time.Second, "the condition", func() bool {
		for _, ev := range r.snapshot() {
			if ev.kind == "ack" {
				return true
			}
		}
		return false
	})
	var dead bool
	for _, ev := range r.snapshot() {
		dead = dead || (ev.kind == "transfer" && ev.dest.DeadLetter)
	}
	if app.count() != 0 || !dead {
		t.Fatalf("calls %d, dead-lettered %v, events %v; want no call and a dead letter", app.count(), dead, r.snapshot())
	}
	if n := e.limiter.InFlight(); n != 0 {
		t.Fatalf("%d slots taken after the walk ended", n)
	}
}

// A first delivery waits for its call's slot at admission, on the source's
// goroutine, as a hand-written consumer's fixed workers take no more than
// they can call: the source takes nothing more meanwhile, no walk is
// started, and the message's deadline, which counts from its first
// attempt, has not begun — so a wait longer than the deadline still ends
// in a call. A delivery lost while it waits is left alone, and its place
// in the queue goes with it.
func TestFirstDeliveryWaitsForItsSlotAtAdmission(t *testing.T) {
	r := newRig(t)
	app := newScriptApp(handler.Result{Outcome: budget.Success}, 0)
	clock := newTestClock()
	gone, first, second := r.delivery("gone"), r.delivery("first"), r.delivery("second")
	e := r.engineWith(app, func(o *Options) {
		o.MaxConcurrency = 1
		o.Policy.Deadline = 100 * time.Millisecond
	}, gone, first, second)
	e.limiter, e.now = budget.NewLimiter(1), clock.Now
	defer runHoldingTheSlot(t, e)()
	testkit.Eventually(t, 30*time.Second, "the first delivery queued at admission", func() bool { return e.limiter.Queued() == 1 })
	if n := e.Status().Routes[0].InFlight; n != 0 {
		t.Fatalf("%d walks started while the delivery waits for a slot; want none", n)
	}
	src := e.o.Routes[0].Sources[0].(*fakeSource)
	if at := src.at.Load(); at != 0 {
		t.Fatalf("the source is at delivery %d, want 0: the first waits for a slot", at)
	}
	close(gone.lost) // the channel went: its place in the queue goes too
	testkit.Eventually(t, 30*time.Second, "the next delivery queued in its place", func() bool {
		return src.at.Load() == 1 && e.limiter.Queued() == 1 && e.Status().Routes[0].InFlight == 0
	})
	clock.Advance(time.Second) // ten deadlines, all spent waiting to be taken
	e.limiter.Release(0)
	testkit.Eventually(t, 30*time.Second, "both called and acked", func() bool {
		n := 0
		for _, ev := range r.snapshot() {
			if ev.kind == "ack" {
				n++
			}
		}
		return n == 2 && app.count() == 2
	})
	if ev := r.snapshot(); len(ev) != 2 {
		t.Fatalf("events %v; want the two acks alone: nothing moved on, the lost one left alone", kinds(ev))
	}
	app.mu.Lock()
	attempts := fmt.Sprint(app.attempts)
	app.mu.Unlock()
	if want := "map[first:[1] second:[1]]"; attempts != want {
		t.Fatalf("attempts by event %s, want %s", attempts, want)
	}
	if n := e.limiter.InFlight(); n != 0 {
		t.Fatalf("%d slots taken after the walks ended", n)
	}
}

// copyDelivery is a retry copy of id whose attempt 1 failed.
func (r *rig) copyDelivery(id string) *fakeDelivery {
	d := r.delivery(id)
	d.msg.Copy = true
	tr := broker.Trail{EventID: id, Attempt: 1, Hops: 1, FirstAttemptAt: time.Now(), Deadline: time.Now().Add(time.Hour)}
	d.msg.Headers = tr.Headers()
	return d
}

// A re-attempt that succeeds gives its token back: with one token and a clock
// that never moves (so none comes back by time), forty waiting re-attempts
// all reach the app when it answers, one after another on the same token;
// when they fail, one token pays for one re-attempt and no more.
func TestSucceedingReattemptsRefundTheirToken(t *testing.T) {
	frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		res   budget.Outcome
		calls int
	}{
		{"success", budget.Success, 40},
		{"failure", budget.Retry, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			app := newScriptApp(handler.Result{Outcome: tc.res}, 0)
			var ds []broker.Delivery
			for i := range 40 {
				ds = append(ds, r.copyDelivery(fmt.Sprintf("c-%d", i)))
			}
			b := budget.NewRetryBudget(0, 1, time.Second, func() time.Time { return frozen })
			e := r.engineWith(app, func(o *Options) { o.Budget = b; o.MaxConcurrency = 4 }, ds...)
			e.limiter = budget.NewLimiter(4)
			settled := func() int {
				n := 0
				for _, ev := range r.snapshot() {
					if ev.kind == "ack" {
						n++
					}
				}
				return n
			}
			run(t, e, func() bool { return app.count() >= tc.calls && settled() >= tc.calls })
			if got := app.count(); got != tc.calls {
				t.Errorf("app called %d times, want %d", got, tc.calls)
			}
			want := 1.0
			if tc.res != budget.Success {
				want = 0
			}
			if st := b.State(); st.Tokens != want {
				t.Errorf("tokens left = %v, want %v", st.Tokens, want)
			}
		})
	}
}

// A re-attempt whose token was taken, and whose call found the app
// unreachable, gives the token back when its deadline passes while it waits
// for the app: no call was made, so nothing was spent.
func TestTokenBackWhenTheDeadlinePassesWhileTheAppIsDown(t *testing.T) {
	frozen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := newRig(t, budget.Unreachable)
	d := r.delivery("late")
	d.msg.Copy = true
	deadline := time.Now().Add(300 * time.Millisecond)
	tr := broker.Trail{EventID: "late", Attempt: 1, Hops: 1, FirstAttemptAt: time.Now(), Deadline: deadline}
	d.msg.Headers = tr.Headers()
	b := budget.NewRetryBudget(0, 1, time.Second, func() time.Time { return frozen })
	e := r.engine(4, d)
	e.o.Budget = b
	run(t, e, func() bool {
		if time.Now().After(deadline) {
			r.app.probeOK.Store(true) // the app is back, too late
		}
		ev := r.snapshot()
		return len(ev) >= 2
	})
	ev := r.snapshot()
	if len(ev) != 2 || ev[0].kind != "transfer" || !ev[0].dest.DeadLetter {
		t.Fatalf("events = %v, want a dead-letter copy and an ack", kinds(ev))
	}
	if st := b.State(); st.Tokens != 1 {
		t.Errorf("tokens = %v after the walk ended, want the 1 it took back", st.Tokens)
	}
}

// runHoldingTheSlot takes e's one slot for the test, runs e, and returns
// what stops it.
func runHoldingTheSlot(t *testing.T, e *Engine) (stop func()) {
	t.Helper()
	if !e.limiter.TryAcquire() {
		t.Fatal("no slot free at the start")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	return func() { cancel(); <-done }
}
