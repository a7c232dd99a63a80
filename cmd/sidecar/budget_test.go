package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/testkit"
)

// TestRetryBudgetThroughAnOutageRabbitMQ runs the real binary against the
// real RabbitMQ with a backlog of 1,000 messages and an app that answers 503
// to everything for 8 s, then 200. The retry budget keeps the re-attempts
// during the outage within ratio × first attempts plus the floor; fresh
// intake pauses instead of feeding more failures; and when the app comes
// back the backlog — much of it waiting in the retry tiers — drains at the
// app's pace, not the budget floor's: succeeding re-attempts give their
// tokens back. Every message is handled and none is dead-lettered.
func TestRetryBudgetThroughAnOutageRabbitMQ(t *testing.T) {
	t.Parallel()
	const (
		n      = 1000
		outage = 8 * time.Second
		ratio  = 0.2
		// Tokens a second. Low enough that the outage's re-attempts spend
		// the budget however few calls a loaded machine makes in it: the
		// adaptive limit falls to one call at a time on the first 503s,
		// and at 5 a second the floor alone once kept up with them.
		floor       = 1.0
		window      = 10 * time.Second
		concurrency = 16
	)
	bin := sidecarBinary(t)
	conn := dialRabbit(t)
	tiers := []time.Duration{time.Second, 2 * time.Second}
	q := testQueue(t, conn, tiers)
	var (
		mu    sync.Mutex
		first time.Time
	)
	a := newApp(t, func(w http.ResponseWriter, c call, _ []call) {
		// Down or not by the call's arrival, the time handled() reads: a
		// call that arrived just before the outage's end and was answered
		// after it would be a success that handled() never counts.
		mu.Lock()
		if first.IsZero() {
			first = c.At
		}
		down := c.At.Sub(first) < outage
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		if down {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	var msgs []publishing
	for i := range n {
		id := fmt.Sprintf("b-%d", i)
		msgs = append(msgs, publishing{MessageId: id, Body: []byte(id)})
	}
	publish(t, conn, q, msgs...)

	cfgPath := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: %d}
sources:
  - name: budget
    rabbitmq: {url: %q, queue: %q, prefetch: %d}
retry: {max_attempts: 100, tiers: [1s, 2s], base: 100ms, cap: 2s}
budget: {ratio: %v, min_per_second: %v, window: %s}
telemetry: {metrics_listen: ""}
admin: {listen: "127.0.0.1:0"}
journal: {path: %q}
`, a.url(), concurrency, brokertest.RabbitURL(), q, concurrency, ratio, floor, window, filepath.Join(t.TempDir(), "handoff.db")))
	var logs bytes.Buffer
	cmd := exec.Command(bin, "run", "--config", cfgPath)
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sidecar log:\n%s", tail(logs.String(), 40))
		}
	})

	handled := func() int {
		ok := map[string]bool{}
		mu.Lock()
		end := first.Add(outage)
		mu.Unlock()
		for _, c := range a.allCalls() {
			if !c.At.Before(end) {
				ok[c.Header.Get("Ce-Id")] = true
			}
		}
		return len(ok)
	}
	testkit.Eventually(t, 90*time.Second, "every message handled after the outage", func() bool { return handled() == n })
	testkit.Eventually(t, 10*time.Second, "the queues empty", func() bool {
		for _, tier := range tiers {
			if depth(t, conn, rabbitmq.TierQueue(q, tier)) != 0 {
				return false
			}
		}
		return depth(t, conn, q) == 0 && depth(t, conn, rabbitmq.RetryQueue(q)) == 0
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("sidecar exited with %v", err)
	}

	mu.Lock()
	end := first.Add(outage)
	mu.Unlock()
	var fresh, again, after int
	var last time.Time // the last call after the outage
	for _, c := range a.allCalls() {
		attempt, _ := strconv.Atoi(c.Header.Get("Handoff-Attempt"))
		switch {
		case !c.At.Before(end):
			after++
			if c.At.After(last) {
				last = c.At
			}
		case attempt == 1:
			fresh++
		default:
			again++
		}
	}
	limit := ratio*float64(fresh) + floor*(outage+window).Seconds() + concurrency
	drained := last.Sub(end)
	t.Logf("outage of %v: %d first attempts, %d re-attempts (budget allows %.0f); %d calls after it for %d messages; the last handled %v after the app came back",
		outage, fresh, again, limit, after, n, drained.Round(10*time.Millisecond))
	// Each message that failed during the outage waits in a tier for its
	// re-attempt. Were those paced by the floor, the last would go a
	// token's worth apart: fresh/floor seconds after the app came back.
	// Refunded tokens let them through at the app's pace instead: about 5 s
	// on an idle machine, 16 s seen with a core taken and the suite beside
	// it, where the floor's pace would have been 26 s. A bound relative to
	// the floor, not to the clock: a loaded machine is slow both ways.
	if floorPaced := time.Duration(float64(fresh) / floor * float64(time.Second)); drained > floorPaced {
		t.Errorf("the backlog drained %v after the app came back, no sooner than the budget floor would let %d re-attempts through (%v): recovery follows the floor, not the app", drained, fresh, floorPaced)
	}
	if float64(again) > limit {
		t.Errorf("%d re-attempts during the outage, more than ratio × first attempts + floor × time + concurrency = %.0f", again, limit)
	}
	if fresh >= n {
		t.Errorf("all %d messages had their first attempt during the outage: fresh intake never paused", fresh)
	}
	if got := len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))); got != 0 {
		t.Errorf("%d messages dead-lettered, want none", got)
	}
	for _, want := range []string{"retry budget spent", "fresh intake paused", "fresh intake resumed", "concurrency limit changed"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log does not say %q:\n%s", want, tail(logs.String(), 30))
		}
	}
}
