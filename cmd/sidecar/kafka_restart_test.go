package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/testkit"
)

// resumeBound is how soon after its start a sidecar restarted on the same
// journal must be consuming again. A member that joins under a new id waits
// for the killed member's session to time out (45 s by default), and longer
// after several kills in a row.
const resumeBound = 10 * time.Second

// TestKafkaRestartAfterSIGKILLResumesAtOnce kills the real binary with
// SIGKILL again and again while it works through a backlog on Apache Kafka,
// with the default config (no instance_id, the default session timeout), and
// starts it again on the same journal each time: every restart is consuming
// again at once, as the same static group member; every message ends
// handled or dead-lettered, no DLQ copy twice; and the last, clean stop
// leaves the group. The same with transactional_transfer, whose
// transactional id follows the member, so a restart also aborts at once the
// transaction that the kill left open.
//
// On kfake too: copies in the retry topic, paused until due or waiting for a
// budget token, are what a kill finds there.
func TestKafkaRestartAfterSIGKILLResumesAtOnce(t *testing.T) {
	t.Parallel()
	for _, b := range kafkaBackends() {
		for _, transactional := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/transactional=%v", b.name, transactional), func(t *testing.T) {
				t.Parallel()
				testRestartAfterSIGKILL(t, b, transactional)
			})
		}
	}
}

func testRestartAfterSIGKILL(t *testing.T, b kafkaBackend, transactional bool) {
	bin := sidecarBinary(t)
	brokers, topic := b.topic(t, "restart", 3)
	group := kafkaGroup(topic)
	kind := func(id string) string { return id[:strings.IndexByte(id, '-')] }

	var mu sync.Mutex
	handled := map[string]bool{}
	a := newApp(t, func(w http.ResponseWriter, c call, prior []call) {
		time.Sleep(10 * time.Millisecond)
		id := c.Header.Get("Ce-Id")
		switch {
		case kind(id) == "poison":
			w.WriteHeader(http.StatusUnprocessableEntity)
		case kind(id) == "flaky" && len(prior) == 0:
			w.WriteHeader(http.StatusInternalServerError)
		default:
			mu.Lock()
			handled[id] = true
			mu.Unlock()
			w.WriteHeader(http.StatusOK)
		}
	})
	cfgPath := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 4}
sources:
  - name: restart
    kafka: {brokers: [%q], topic: %q, group: %q, transactional_transfer: %v}
retry: {max_attempts: 10, tiers: [300ms], base: 50ms, cap: 200ms}
telemetry: {metrics_listen: ""}
admin: {listen: "127.0.0.1:0"}
journal: {path: %q}
`, a.url(), strings.Join(brokers, ","), topic, group, transactional, filepath.Join(t.TempDir(), "handoff.db")))

	ids := mixedWorkload(400)
	var recs []*kgo.Record
	for i, id := range ids {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(i % 30)), Value: []byte(id),
			Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}})
	}
	produceKafka(t, brokers, recs...)

	var logs []*bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			for i, l := range logs {
				t.Logf("run %d's log:\n%s", i+1, tail(l.String(), 30))
			}
		}
	})
	// start runs the binary and waits for the app's first call after the
	// start: the process is consuming.
	start := func() (*exec.Cmd, time.Duration) {
		var l bytes.Buffer
		logs = append(logs, &l)
		cmd := exec.Command(bin, "run", "--config", cfgPath)
		cmd.Stderr = &l
		began := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		var first time.Time
		testkit.Eventually(t, 90*time.Second, fmt.Sprintf("run %d to consume", len(logs)), func() bool {
			for _, c := range a.allCalls() {
				if c.At.After(began) {
					first = c.At
					return true
				}
			}
			return false
		})
		return cmd, first.Sub(began)
	}

	const kills = 4
	var resumes []time.Duration
	for range kills {
		cmd, took := start()
		resumes = append(resumes, took)
		// Killed while it works: calls, copies and commits in flight.
		time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
	}
	final, took := start()
	resumes = append(resumes, took)
	var slowest time.Duration
	for i, d := range resumes {
		slowest = max(slowest, d)
		if i > 0 && d > resumeBound {
			t.Errorf("run %d, started after a SIGKILL, consumed again only %v after its start (want within %v)", i+1, d.Round(time.Millisecond), resumeBound)
		}
	}
	t.Logf("%d SIGKILLs: each run consuming again after %v of its start (slowest %v)", kills, roundAll(resumes), slowest.Round(time.Millisecond))

	dlq := kafka.DeadLetterTopic(topic, group)
	deadLetters := func() map[string]int {
		dead := map[string]int{}
		for _, r := range readTopic(t, brokers, dlq) {
			dead[header(r, broker.HeaderEventID)]++
		}
		return dead
	}
	settled := func() bool {
		dead := deadLetters()
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if !handled[id] && dead[id] == 0 {
				return false
			}
		}
		return true
	}
	testkit.Eventually(t, 90*time.Second, "every message handled or dead-lettered", settled)
	if err := final.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := final.Wait(); err != nil {
		t.Errorf("final sidecar exited with %v after SIGTERM", err)
	}

	dead := deadLetters()
	dup, wrong := 0, 0
	for _, id := range ids {
		dup += max(dead[id]-1, 0)
		if (kind(id) == "poison") != (dead[id] > 0) {
			wrong++
			t.Errorf("%s: %d DLQ copies", id, dead[id])
		}
	}
	t.Logf("%d messages: %d handled, %d dead-lettered, %d duplicate DLQ copies, %d app calls", len(ids), len(handled), len(dead), dup, len(a.allCalls()))
	if dup != 0 {
		t.Errorf("%d duplicate DLQ copies", dup)
	}

	// Every run was the same member of the group.
	member := regexp.MustCompile(`"msg":"kafka group member",.*"instance_id":"([^"]+)"`)
	seen := map[string]bool{}
	for _, l := range logs {
		if m := member.FindStringSubmatch(l.String()); m != nil {
			seen[m[1]] = true
		}
	}
	if len(seen) != 1 {
		t.Errorf("the runs joined under %d instance ids, want one: %v", len(seen), seen)
	}

	// The clean stop took the member out of the group, and committed the
	// log end: nothing waits for a session timeout, nothing is consumed again.
	checkGroupEmpty(t, brokers, group)
	checkCommittedAtLogEnd(t, brokers, topic)
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// checkGroupEmpty fails unless group has no member.
func checkGroupEmpty(t *testing.T, brokers []string, group string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	groups, err := kadm.NewClient(cl).DescribeGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	g, ok := groups[group]
	if !ok || g.Err != nil {
		t.Fatalf("describe group %s: %v", group, g.Err)
	}
	if len(g.Members) != 0 {
		var ms []string
		for _, m := range g.Members {
			ms = append(ms, fmt.Sprintf("%s (instance %v)", m.MemberID, m.InstanceID))
		}
		t.Errorf("group %s still has members after a clean stop: %v", group, ms)
	}
}
