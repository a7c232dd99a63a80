package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/rabbitmq"
)

// TestSIGKILLMixedWorkload kills the real binary with SIGKILL several times
// during a mixed workload (successes, transient failures, poison messages)
// and restarts it on the same journal, then accounts for every message:
// none lost, poison ones (and only they) dead-lettered; it reports how often
// the app was called again after it had already succeeded, and how many DLQ
// copies were written twice.
//
// A DLQ copy is written twice only when the kill lands between the broker
// taking the copy and the journal recording its confirm (a few milliseconds):
// the restart republishes it. Both copies are then identical — same event id,
// hop and attempt — so whoever owns the dead letters can drop the second.
func TestSIGKILLMixedWorkload(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	conn := dialRabbit(t)
	const tierD = 300 * time.Millisecond
	q := testQueue(t, conn, []time.Duration{tierD})

	kind := func(id string) string { return id[:strings.IndexByte(id, '-')] }
	var mu sync.Mutex
	succeeded := map[string]int{}    // calls answered 200, per id
	afterSuccess := map[string]int{} // calls after the first 200
	a := newApp(t, func(w http.ResponseWriter, c call, prior []call) {
		time.Sleep(15 * time.Millisecond)
		id := c.Header.Get("Ce-Id")
		mu.Lock()
		defer mu.Unlock()
		if succeeded[id] > 0 {
			afterSuccess[id]++
		}
		switch {
		case kind(id) == "poison":
			w.WriteHeader(http.StatusUnprocessableEntity)
		case kind(id) == "flaky" && len(prior) == 0:
			w.WriteHeader(http.StatusInternalServerError)
		default:
			succeeded[id]++
			w.WriteHeader(http.StatusOK)
		}
	})
	// An attempt cut off by a kill counts as a failed (unknown) one; with
	// several kills landing on the same redelivered messages a small
	// max_attempts would dead-letter a good message, which is the budget
	// working, not what this test is about.
	journalPath := filepath.Join(t.TempDir(), "handoff.db")
	cfgPath := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 8}
sources:
  - name: kill
    rabbitmq: {url: %q, queue: %q, prefetch: 8}
retry: {max_attempts: 10, tiers: [%s], base: 50ms, cap: 200ms}
telemetry: {metrics_listen: ""}
admin: {listen: "127.0.0.1:0"}
journal: {path: %q}
`, a.url(), rabbitURL(), q, tierD, journalPath))

	var ids []string
	var msgs []publishing
	for i := range 600 {
		id := fmt.Sprintf("ok-%d", i)
		switch {
		case i%10 == 0:
			id = fmt.Sprintf("poison-%d", i)
		case i%10 < 4:
			id = fmt.Sprintf("flaky-%d", i)
		}
		ids = append(ids, id)
		msgs = append(msgs, publishing{MessageId: id, Body: []byte(id)})
	}
	publish(t, conn, q, msgs...)

	var logs bytes.Buffer
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "--config", cfgPath)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	const kills = 5
	for k := range kills {
		cmd := start()
		time.Sleep(time.Duration(250+rand.IntN(250)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		t.Logf("kill %d: %d app calls so far", k+1, len(a.allCalls()))
	}
	final := start()
	t.Cleanup(func() {
		_ = final.Process.Signal(syscall.SIGTERM)
		_ = final.Wait()
	})

	queues := []string{q, rabbitmq.RetryQueue(q), rabbitmq.TierQueue(q, tierD)}
	dlq := rabbitmq.DeadLetterQueue(q)
	done := func() bool {
		for _, name := range queues {
			if depth(t, conn, name) != 0 {
				return false
			}
		}
		mu.Lock()
		handled := len(succeeded)
		mu.Unlock()
		return handled+depth(t, conn, dlq) >= len(ids)
	}
	deadline := time.Now().Add(90 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("workload not finished after the last restart; sidecar log tail:\n%s", tail(logs.String(), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // let anything still in flight land
	if err := final.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := final.Wait(); err != nil {
		t.Errorf("final sidecar exited with %v after SIGTERM", err)
	}

	dead := map[string]int{}
	first := map[string]string{} // id → the copy's hop/attempt/reason
	for _, d := range drain(t, conn, dlq) {
		id, _ := d.Headers[broker.HeaderEventID].(string)
		dead[id]++
		sig := fmt.Sprint(d.Headers[broker.HeaderHops], "/", d.Headers[broker.HeaderAttempt], "/", d.Headers[broker.HeaderDeadReason])
		if kind(id) != "poison" {
			t.Logf("good message %s dead-lettered: hops/attempt/reason %s, error %v", id, sig, d.Headers[broker.HeaderError])
		}
		if prev, ok := first[id]; ok && prev != sig {
			t.Errorf("two different DLQ copies of %s: %s and %s", id, prev, sig)
		}
		first[id] = sig
	}
	mu.Lock()
	defer mu.Unlock()
	lost, dupDLQ, wrongDLQ, missingDLQ, callsAfter := 0, 0, 0, 0, 0
	for _, id := range ids {
		if succeeded[id] == 0 && dead[id] == 0 {
			lost++
			t.Errorf("lost: %s", id)
		}
		if dead[id] > 1 {
			dupDLQ += dead[id] - 1
		}
		if kind(id) == "poison" && dead[id] == 0 {
			missingDLQ++
		}
		if kind(id) != "poison" && dead[id] > 0 {
			wrongDLQ++
		}
		callsAfter += afterSuccess[id]
	}
	t.Logf("%d messages, %d SIGKILLs, %d app calls: lost=%d duplicate DLQ copies=%d app calls after success=%d (on %d messages)",
		len(ids), kills, len(a.allCalls()), lost, dupDLQ, callsAfter, len(afterSuccess))
	if lost != 0 {
		t.Errorf("%d messages lost", lost)
	}
	if dupDLQ > kills {
		t.Errorf("%d duplicate DLQ copies from %d kills: more than the confirm window explains", dupDLQ, kills)
	}
	if missingDLQ != 0 || wrongDLQ != 0 {
		t.Errorf("%d poison messages missing from the DLQ, %d good ones in it", missingDLQ, wrongDLQ)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
