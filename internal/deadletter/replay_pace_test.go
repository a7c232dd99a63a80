package deadletter

import (
	"context"
	"errors"
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/testkit"
)

// A run's pace: its rate after the sample and after a slow read, its pauses
// under the app's pressure and by hand, and the pace it reports.

// A slow read of the dead-letter log does not make the run burst: the
// bucket is emptied after the read of the batch that follows the sample (and
// the sample's own at the run's start), so the first second after the sample
// holds the rate, not the rate plus what refilled while reading.
func TestReplayKeepsItsRateAfterASlowRead(t *testing.T) {
	f := newReplayFixture(t, 50)
	m, _ := f.manager(t, "replica-a", f.x, nil)
	f.approve(t, m, f.ids, nil)
	f.dlq.mu.Lock()
	f.dlq.readDelay = 400 * time.Millisecond
	f.dlq.mu.Unlock()
	const rate = 20
	run, err := m.CreateReplay(context.Background(), ReplayRequest{IDs: f.ids, Rate: rate, Sample: 2, Who: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if run = waitRun(t, m, run.ID); run.State != RunCompleted || run.Progress.Handled != 50 {
		t.Fatalf("run %+v", run)
	}
	got := f.app.got()
	if len(got) != 50 {
		t.Fatalf("%d copies, want 50", len(got))
	}
	sort.Slice(got, func(i, j int) bool { return got[i].at.Before(got[j].at) })
	start, n := got[2].at, 0
	for _, c := range got[2:] {
		if c.at.Sub(start) < time.Second {
			n++
		}
	}
	// A second at 20/s holds 20 slots after the first publish, one for
	// the bucket's fraction of a token, and four of slack: the first may
	// arrive up to 200 ms late on a loaded machine while the ones behind it
	// keep their slots (one 120 ms late made 23). The read's 400 ms, had
	// it refilled the bucket, would have added 8.
	if limit := rate + 5; n > limit {
		t.Errorf("after the sample: %d copies in the first second at %d/s, want at most %d", n, rate, limit)
	}
}

func TestReplayPausesUnderPressureAndCancels(t *testing.T) {
	f := newReplayFixture(t, 10)
	var mu sync.Mutex
	pressure := "app overloaded"
	m, _ := f.manager(t, "replica-a", f.x, func() string { mu.Lock(); defer mu.Unlock(); return pressure })
	f.approve(t, m, f.ids, nil)
	run, err := m.CreateReplay(context.Background(), ReplayRequest{IDs: f.ids, Rate: 5, BatchSize: 1, Who: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the run paused", func() bool {
		r, _ := m.Replay(run.ID)
		return r.Paused && r.Detail == "app overloaded"
	})
	if n := len(f.app.got()); n != 0 {
		t.Fatalf("%d published while the app was overloaded", n)
	}
	f.app.mu.Lock()
	f.app.before = func(n int) error {
		if n == 4 {
			mu.Lock()
			pressure = "fresh intake paused"
			mu.Unlock()
		}
		return nil
	}
	f.app.mu.Unlock()
	mu.Lock()
	pressure = ""
	mu.Unlock()
	testkit.Eventually(t, 20*time.Second, "5 copies published", func() bool { return len(f.app.got()) >= 5 })
	if r, err := m.CancelReplay(context.Background(), run.ID, "bob", "enough"); err != nil || r.State != RunCancelled {
		t.Fatalf("cancel: %+v, %v", r, err)
	}
	mu.Lock()
	pressure = ""
	mu.Unlock()
	run = waitRun(t, m, run.ID)
	// The fifth copy's record may come after the cancel's.
	testkit.Eventually(t, 20*time.Second, "the fifth copy recorded", func() bool {
		run, _ = m.Replay(run.ID)
		return run.Progress.Published >= 5
	})
	if run.State != RunCancelled || run.Progress.Published != 5 || run.Detail != "cancelled by bob: enough" {
		t.Fatalf("run %+v", run)
	}
	if _, err := m.CancelReplay(context.Background(), run.ID, "bob", ""); !errors.Is(err, ErrIllegal) {
		t.Fatalf("cancelled twice: %v", err)
	}
}

// An operator's pause holds the run before its next publish, outlasts the
// runner's heartbeats (with a reason as long as a record allows), and is
// refused twice; what the operator changes while it is paused counts once
// it resumes, in the batch being sent and in the one read ahead: a letter
// terminated is not published, one approved again goes with its new repair.
func TestReplayPausedByHandResumes(t *testing.T) {
	f := newReplayFixture(t, 8)
	m, _ := f.manager(t, "replica-a", f.x, nil)
	f.approve(t, m, f.ids, nil)
	reason := strings.Repeat("r", MaxWhyLen)
	ids := make(chan string, 1) // the run's id, once CreateReplay returned it
	paused := make(chan Run, 1)
	f.app.mu.Lock()
	f.app.before = func(n int) error {
		if n == 1 {
			// The pause is recorded while the second copy is on its way:
			// the third, a second later at this rate, must not start.
			r, err := m.PauseReplay(context.Background(), <-ids, "bob", reason)
			if err != nil {
				t.Errorf("pause: %v", err)
			}
			paused <- r
		}
		return nil
	}
	f.app.mu.Unlock()
	if _, err := m.ResumeReplay(context.Background(), "no-such-replay", "bob", ""); !errors.Is(err, ErrNoRun) {
		t.Fatalf("resumed a replay that does not exist: %v", err)
	}
	run, err := m.CreateReplay(context.Background(), ReplayRequest{IDs: f.ids, Rate: 1, BatchSize: 4, Who: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	id := run.ID
	ids <- id
	var p Run
	select {
	case p = <-paused:
	case <-time.After(30 * time.Second):
		t.Fatal("the second copy was never published")
	}
	if !p.Held || !p.Paused || p.Detail != "paused by bob: "+reason {
		t.Fatalf("paused run %+v", p)
	}
	if _, err := m.PauseReplay(context.Background(), id, "carol", ""); !errors.Is(err, ErrIllegal) {
		t.Fatalf("paused twice: %v", err)
	}
	// Heartbeats come (every third of the TTL) for two seconds, two of the
	// rate's slots, and the run stays held.
	testkit.Eventually(t, 20*time.Second, "two seconds of heartbeats after the pause", func() bool {
		r, _ := m.Replay(id)
		return r.HeartbeatAt.Sub(p.HeartbeatAt) >= 2*time.Second
	})
	if r, _ := m.Replay(id); !r.Held || !r.Paused || r.State != RunRunning || r.Detail != p.Detail {
		t.Fatalf("held run after heartbeats: %+v", r)
	}
	if n := len(f.app.got()); n != 2 {
		t.Fatalf("%d published; want the 2 before the pause", n)
	}
	// While paused: the third (in the batch being sent) is terminated, the
	// seventh (in the batch read ahead) approved again with a repair.
	if _, err := m.Apply(context.Background(), Change{ID: f.ids[2], Transition: Terminate, Who: "bob", Why: "not to be replayed"}); err != nil {
		t.Fatal(err)
	}
	f.approve(t, m, f.ids[6:7], &Repair{Body: []byte("repaired-6"), Note: "fixed"})
	if r, err := m.ResumeReplay(context.Background(), id, "bob", "fixed"); err != nil || r.Held || r.Paused {
		t.Fatalf("resume: %+v, %v", r, err)
	}
	if _, err := m.ResumeReplay(context.Background(), id, "bob", ""); !errors.Is(err, ErrIllegal) {
		t.Fatalf("resumed twice: %v", err)
	}
	run = waitRun(t, m, id)
	if run.State != RunCompleted || run.Progress.Published != 7 || run.Progress.Skipped != 1 {
		t.Fatalf("run %+v", run)
	}
	bodies := map[string]string{}
	for _, c := range f.app.got() {
		bodies[c.trail[broker.HeaderReplayOf]] = c.body
	}
	if _, ok := bodies[f.ids[2].String()]; ok || len(bodies) != 7 {
		t.Fatalf("published %d, the terminated one among them: %v", len(bodies), ok)
	}
	if b := bodies[f.ids[6].String()]; b != "repaired-6" {
		t.Fatalf("the letter approved again went with %q, not its new repair", b)
	}
	if _, err := m.PauseReplay(context.Background(), id, "bob", ""); !errors.Is(err, ErrIllegal) {
		t.Fatalf("paused an ended run: %v", err)
	}
}

// A run's rate is the pace of its recent publishing, whatever it waited
// before (the sample's outcomes, a takeover); the waits are reported apart.
func TestPublishPace(t *testing.T) {
	at := func(start time.Duration, n int, every time.Duration) []time.Time {
		var out []time.Time
		for i := range n {
			out = append(out, t0.Add(start+time.Duration(i)*every))
		}
		return out
	}
	tests := []struct {
		name       string
		ats        []time.Time
		rate       float64
		wantRate   float64
		wantWaited time.Duration
	}{
		{"steady", at(0, 41, 50*time.Millisecond), 20, 20, 0},
		// A sample of 3, 5 s waiting for its outcomes, then the rest.
		{"after the sample", append(at(0, 3, 50*time.Millisecond), at(5*time.Second+100*time.Millisecond, 60, 50*time.Millisecond)...), 20, 20, 5*time.Second + 100*time.Millisecond - 100*time.Millisecond},
		// A takeover's 8 s gap inside the last 10 s.
		{"a takeover", append(at(0, 40, 50*time.Millisecond), at(2*time.Second+8*time.Second, 20, 50*time.Millisecond)...), 20, 20, 8*time.Second + 50*time.Millisecond},
		{"one publish", at(0, 1, 0), 20, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rate, waited := publishPace(tt.ats, tt.rate)
			if math.Abs(rate-tt.wantRate) > 0.5 {
				t.Errorf("rate %.2f/s, want %.0f/s", rate, tt.wantRate)
			}
			if d := waited - tt.wantWaited; d < -100*time.Millisecond || d > 100*time.Millisecond {
				t.Errorf("waited %v, want %v", waited, tt.wantWaited)
			}
		})
	}
}
