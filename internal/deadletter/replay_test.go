package deadletter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/testkit"
)

// fakeApp is the source a replay republishes to, and the app behind it: a
// copy it handles is reported to the manager as the engine reports it; a
// copy it fails becomes a new dead letter, as the engine makes one.
type fakeApp struct {
	mu     sync.Mutex
	copies []replayed
	// fail says whether the app fails a copy.
	fail func(body string) bool
	// before, when set, runs before each publish; an error fails it.
	before  func(n int) error
	handled func(broker.Trail)
	dlq     *memLog
}

type replayed struct {
	at          time.Time
	body        string
	contentType string
	trail       broker.Headers
	headers     broker.Headers
}

func (a *fakeApp) Republish(_ context.Context, msg *broker.Message, trail broker.Headers) error {
	a.mu.Lock()
	n := len(a.copies)
	before := a.before
	a.mu.Unlock()
	if before != nil {
		if err := before(n); err != nil {
			return err
		}
	}
	a.mu.Lock()
	a.copies = append(a.copies, replayed{at: time.Now(), body: string(msg.Body), contentType: msg.ContentType, trail: trail, headers: msg.Headers})
	fail := a.fail != nil && a.fail(string(msg.Body))
	handled := a.handled
	a.mu.Unlock()
	t := broker.Trail{EventID: trail[broker.HeaderEventID], ReplayID: trail[broker.HeaderReplayID], ReplayOf: trail[broker.HeaderReplayOf]}
	if fail {
		t.Attempt, t.Hops, t.DeadReason, t.ErrorClass, t.Error = 1, 1, "permanent", "permanent", "still broken"
		t.DeadLetteredAt = time.Now()
		a.dlq.add(NoPartition, time.Now(), &broker.Message{Body: msg.Body, ContentType: msg.ContentType, Headers: t.Headers()})
		return nil
	}
	handled(t)
	return nil
}

func (a *fakeApp) got() []replayed {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]replayed(nil), a.copies...)
}

// replayFixture is one source's logs with n pending dead letters, and a
// manager per replica over them, each with an index of its own.
type replayFixture struct {
	*fixture
	app *fakeApp
	ids []ID
}

func newReplayFixture(t *testing.T, n int) *replayFixture {
	f := &replayFixture{fixture: newFixture(t, false)}
	f.app = &fakeApp{dlq: f.dlq}
	for i := range n {
		off := f.dlq.add(NoPartition, t0, deadLetter(fmt.Sprint("ev-", i), "permanent"))
		f.ids = append(f.ids, ID{Log: f.dlq.Name(), Partition: NoPartition, Offset: off})
	}
	return f
}

// manager starts a replica named name; its Run ends with the test or when
// stop is called.
func (f *replayFixture) manager(t *testing.T, name string, x *Index, pressure func() string) (*Manager, func()) {
	t.Helper()
	m := NewManager(ManagerOptions{
		Index: x, Sources: []ManagedSource{{Source: f.src, Republisher: f.app}}, Replica: name,
		Pressure: pressure, Poll: 10 * time.Millisecond, HeartbeatTTL: 300 * time.Millisecond,
		Now: time.Now, Logger: quiet(),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	// The app's outcomes go to the replica started last, as the engine of
	// the replica consuming the source reports them.
	f.app.mu.Lock()
	f.app.handled = func(tr broker.Trail) { m.Handled(context.Background(), f.src.Name, tr) }
	f.app.mu.Unlock()
	if _, err := x.CatchUp(ctx, f.src); err != nil {
		t.Fatal(err)
	}
	return m, stop
}

func (f *replayFixture) approve(t *testing.T, m *Manager, ids []ID, repair *Repair) {
	t.Helper()
	for _, id := range ids {
		if _, err := m.Apply(context.Background(), Change{ID: id, Transition: Approve, Who: "alice", Why: "app fixed", Repair: repair}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitRun waits until the run ends and every copy it published has its
// outcome, and returns it.
func waitRun(t *testing.T, m *Manager, id string) Run {
	t.Helper()
	var run Run
	testkit.Eventually(t, 20*time.Second, "replay "+id+" to end", func() bool {
		var err error
		if run, err = m.Replay(id); err != nil {
			t.Fatal(err)
		}
		return run.Ended() && run.Progress.Published == run.Progress.Handled+run.Progress.Failed
	})
	return run
}

func TestReplayPublishesApprovedAtItsRate(t *testing.T) {
	f := newReplayFixture(t, 12)
	m, _ := f.manager(t, "replica-a", f.x, nil)
	f.approve(t, m, f.ids[:10], nil)
	if _, err := m.Apply(context.Background(), Change{ID: f.ids[10], Transition: Terminate, Who: "bob", Why: "duplicate"}); err != nil {
		t.Fatal(err)
	}
	dry, err := m.CreateReplay(context.Background(), ReplayRequest{Filter: Filter{Source: "orders"}, DryRun: true, Who: "alice"})
	if err != nil || len(dry.Spec.IDs) != 10 || !dry.DryRun {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	if runs, _ := m.Replays(""); len(runs) != 0 {
		t.Fatalf("a dry run recorded a run: %+v", runs)
	}
	run, err := m.CreateReplay(context.Background(), ReplayRequest{Filter: Filter{Source: "orders"}, Rate: 40, Sample: 3, Who: "alice", Why: "fixed"})
	if err != nil {
		t.Fatal(err)
	}
	run = waitRun(t, m, run.ID)
	if run.State != RunCompleted || run.Progress.Handled != 10 || run.Progress.Failed != 0 || run.Progress.Remaining != 0 {
		t.Fatalf("run %+v", run)
	}
	got := f.app.got()
	if len(got) != 10 {
		t.Fatalf("%d copies published, want 10", len(got))
	}
	// Publishes overlap (each waits for its confirm while the next starts):
	// the copies are matched by the dead letter they replay.
	byLetter := map[string]replayed{}
	for _, c := range got {
		byLetter[c.trail[broker.HeaderReplayOf]] = c
	}
	for i, id := range f.ids[:10] {
		c, ok := byLetter[id.String()]
		if !ok || c.trail[broker.HeaderReplayID] != run.ID || c.trail[broker.HeaderEventID] != fmt.Sprint("ev-", i) || c.body != `{"amount":"invalid"}` {
			t.Fatalf("copy of %s: %+v", id, c)
		}
	}
	// After the sample, the rest go at the run's rate: 40/s. The bucket
	// is emptied once the sample's outcomes are in, after the sample's
	// last copy arrived, and the k-th copy after it waits k-1 slots of
	// 25 ms at least: the last of seven arrives 150 ms after the sample's
	// last at the earliest, however late any of them is (a publish held up
	// on a busy machine only arrives later; timed from the first of the
	// seven, one that arrived late made the span look short). Unlimited,
	// the seven would arrive within a few ms.
	rest := got[3:]
	if span := rest[len(rest)-1].at.Sub(got[2].at); span < time.Duration(len(rest)-1)*25*time.Millisecond*9/10 {
		t.Fatalf("%d copies %v after the sample: faster than 40/s", len(rest), span)
	}
	// The app's outcome reaches the ledger before the runner's record of
	// the publish (this fake app handles each copy before Republish
	// returns): the history still reads as it happened.
	for _, id := range f.ids[:10] {
		l, err := m.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		var order []Transition
		for _, r := range l.History {
			order = append(order, r.Transition)
		}
		if !slices.Equal(order, []Transition{Approve, Replay, Complete}) {
			t.Errorf("history of %s: %v, want approve, replay, complete", id, order)
		}
	}
	c, _ := m.Counts("orders")
	if c.ByState[Done] != 10 || c.ByState[Terminated] != 1 || c.ByState[Pending] != 1 || c.Open != 1 {
		t.Fatalf("counts %+v", c)
	}
	// A replica built from the logs alone sees the same.
	other := openIndex(t, filepath.Join(t.TempDir(), "other.deadletters"))
	if _, err := other.CatchUp(context.Background(), f.src); err != nil {
		t.Fatal(err)
	}
	if oc, _ := other.Counts("orders"); oc.ByState[Done] != 10 || oc.Open != 1 {
		t.Fatalf("other replica's counts %+v", oc)
	}
	if orun, err := other.Run(run.ID); err != nil || orun.State != RunCompleted || orun.Progress.Handled != 10 {
		t.Fatalf("other replica's run %+v, %v", orun, err)
	}
}

func TestReplayStopsWhenTheSampleFails(t *testing.T) {
	f := newReplayFixture(t, 10)
	f.app.fail = func(string) bool { return true }
	m, _ := f.manager(t, "replica-a", f.x, nil)
	f.approve(t, m, f.ids, nil)
	run, err := m.CreateReplay(context.Background(), ReplayRequest{IDs: f.ids, Rate: 100, Sample: 3, Who: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	run = waitRun(t, m, run.ID)
	if run.State != RunStopped || run.Progress.Failed != 3 || run.Progress.Published != 3 || run.Progress.Remaining != 7 {
		t.Fatalf("run %+v", run)
	}
	if len(f.app.got()) != 3 {
		t.Fatalf("%d published after the sample failed", len(f.app.got()))
	}
	c, _ := m.Counts("orders")
	if c.ByState[FailedReplay] != 3 || c.ByState[Approved] != 7 || c.ByState[Pending] != 3 {
		t.Fatalf("counts %+v (the 3 failed copies are new pending dead letters)", c)
	}
	l, _ := m.Get(f.ids[0])
	succ, err := ParseID(l.Successor)
	if err != nil {
		t.Fatalf("no successor: %+v", l)
	}
	if s, err := m.Get(succ); err != nil || s.State != Pending || s.ReplayOf != f.ids[0].String() || s.ReplayID != run.ID {
		t.Fatalf("successor %+v, %v", s, err)
	}
	t.Log(run.Detail)
}

func TestReplayCarriesTheRepairedBody(t *testing.T) {
	f := newReplayFixture(t, 1)
	m, _ := f.manager(t, "replica-a", f.x, nil)
	f.approve(t, m, f.ids, &Repair{Body: []byte(`{"amount":10}`), ContentType: "application/json", Note: "amount=invalid → amount=10"})
	run, err := m.CreateReplay(context.Background(), ReplayRequest{IDs: f.ids, Who: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	waitRun(t, m, run.ID)
	got := f.app.got()
	if len(got) != 1 || got[0].body != `{"amount":10}` || got[0].trail[broker.HeaderEventID] != "ev-0" {
		t.Fatalf("copies %+v", got)
	}
	msg, err := m.Message(context.Background(), f.ids[0])
	if err != nil || string(msg.Body) != `{"amount":"invalid"}` {
		t.Fatalf("the original is gone: %+v, %v", msg, err)
	}
}

func TestReplayIsTakenOverWhenItsRunnerStops(t *testing.T) {
	f := newReplayFixture(t, 20)
	// Replica a publishes 5, then its broker connection fails for good.
	broken := errors.New("connection lost")
	f.app.before = func(n int) error {
		if n >= 5 {
			return broken
		}
		return nil
	}
	a, stopA := f.manager(t, "replica-a", f.x, nil)
	f.approve(t, a, f.ids, nil)
	run, err := a.CreateReplay(context.Background(), ReplayRequest{IDs: f.ids, Rate: 200, Who: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "5 copies published", func() bool { return len(f.app.got()) >= 5 })
	stopA()
	f.app.mu.Lock()
	f.app.before = nil
	f.app.mu.Unlock()
	start := time.Now()
	b, _ := f.manager(t, "replica-b", openIndex(t, filepath.Join(t.TempDir(), "b.deadletters")), nil)
	run = waitRun(t, b, run.ID)
	if run.State != RunCompleted || run.Progress.Handled != 20 || run.Runner != "replica-b" {
		t.Fatalf("run %+v", run)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Fatalf("taken over after %v, before the heartbeat went stale", took)
	}
	seen := map[string]int{}
	for _, c := range f.app.got() {
		seen[c.trail[broker.HeaderReplayOf]]++
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("%s published %d times", id, n)
		}
	}
	if len(seen) != 20 {
		t.Fatalf("%d published", len(seen))
	}
}

func TestReplayRefusesWhatItCannotDo(t *testing.T) {
	f := newReplayFixture(t, 2)
	m, _ := f.manager(t, "replica-a", f.x, nil)
	for _, r := range []ReplayRequest{
		{IDs: f.ids, Who: "alice"},                       // pending
		{Filter: Filter{Source: "orders"}, Who: "alice"}, // nothing approved
		{Who: "alice"}, // no selection
		{IDs: f.ids[:1], Force: true, Rate: -1, Who: "alice"},        // bad rate
		{IDs: f.ids[:1], Force: true, StopFailureRatio: 2, Who: "a"}, // bad ratio
	} {
		if _, err := m.CreateReplay(context.Background(), r); err == nil {
			t.Fatalf("created %+v", r)
		}
	}
	// Forced, a pending one is approved on the way, in the asker's name.
	run, err := m.CreateReplay(context.Background(), ReplayRequest{IDs: f.ids[:1], Force: true, Who: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	waitRun(t, m, run.ID)
	l, _ := m.Get(f.ids[0])
	if l.State != Done || l.Approval() == nil || l.Approval().Who != "alice" {
		t.Fatalf("forced letter %+v", l)
	}
}

// lineCounter counts the log lines whose message holds a text.
type lineCounter struct {
	mu    sync.Mutex
	lines []string
}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, string(p))
	return len(p), nil
}

func (c *lineCounter) count(level, text string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lines {
		if strings.Contains(l, "level="+level) && strings.Contains(l, text) {
			n++
		}
	}
	return n
}

// A catch-up failing poll after poll (a broker down, or refusing the
// sidecar) is said once, not once a poll; its end is said too.
func TestCatchUpFailureSaidOnce(t *testing.T) {
	f := newFixture(t, false)
	f.dlq.mu.Lock()
	f.dlq.failing = errors.New("broker refused the login")
	f.dlq.mu.Unlock()
	lines := &lineCounter{}
	m := NewManager(ManagerOptions{Index: f.x, Sources: []ManagedSource{{Source: f.src}}, Replica: "r",
		Poll: time.Millisecond, Logger: slog.New(slog.NewTextHandler(lines, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testkit.Eventually(t, 20*time.Second, "ten failed catch-ups", func() bool { return lines.count("DEBUG", "catching up failed again") >= 10 })
	if n := lines.count("WARN", "catching up failed"); n != 1 {
		t.Errorf("%d warnings for one failure that went on", n)
	}
	f.dlq.mu.Lock()
	f.dlq.failing = nil
	f.dlq.mu.Unlock()
	testkit.Eventually(t, 20*time.Second, "the catch-up back", func() bool { return lines.count("INFO", "catching up again") == 1 })
}
