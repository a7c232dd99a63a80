package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/testkit"
)

// TestKafkaTwoSidecarsOneKilled runs two sidecar processes in one group on
// the local Apache Kafka: they share the partitions; one is killed with
// SIGKILL mid-stream; the other takes its partitions over (after the session
// timeout) and every record is handed to the app. Records the killed one had
// handed out but not yet committed come again, each call of them flagged
// Handoff-Redelivered: the survivor's journal never saw them, but the marks
// the killed one shared with the group say it may have called them.
// The same runs with transactional_transfer, where every commit is a
// transaction that a rebalance aborts.
func TestKafkaTwoSidecarsOneKilled(t *testing.T) {
	t.Parallel()
	for _, transactional := range []bool{false, true} {
		t.Run(fmt.Sprintf("transactional=%v", transactional), func(t *testing.T) {
			t.Parallel()
			testTwoSidecarsOneKilled(t, transactional)
		})
	}
}

func testTwoSidecarsOneKilled(t *testing.T, transactional bool) {
	bin := sidecarBinary(t)
	brokers, topic := realKafkaTopic(t, "group", 6)
	a := newApp(t, func(w http.ResponseWriter, _ call, _ []call) {
		time.Sleep(2 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	})
	const n = 3000
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(i % 60)), Value: []byte(fmt.Sprint(i)),
			Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(fmt.Sprintf("r-%05d", i))}}})
	}
	produceKafka(t, brokers, recs...)
	where := map[string]string{} // ce_id → partition/offset, for the evidence
	for _, r := range recs {
		where[string(r.Headers[0].Value)] = fmt.Sprintf("%d/%d", r.Partition, r.Offset)
	}

	start := func(name string) (*exec.Cmd, *bytes.Buffer) {
		path := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 8}
sources:
  - name: group
    kafka: {brokers: [%q], topic: %q, group: %q, session_timeout: 6s, transactional_transfer: %v}
retry: {tiers: [1s]}
telemetry: {metrics_listen: ""}
admin: {listen: "127.0.0.1:0"}
journal: {path: %q}
`, a.url(), strings.Join(brokers, ","), topic, kafkaGroup(topic), transactional, filepath.Join(t.TempDir(), name+".db")))
		var logs bytes.Buffer
		cmd := exec.Command(bin, "run", "--config", path)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, &logs
	}
	first, firstLogs := start("first")
	second, secondLogs := start("second")
	t.Cleanup(func() {
		if t.Failed() {
			// Whole, as far as it goes: what a repeat comes from is at the
			// start (the assignments, the marks read with them).
			t.Logf("first sidecar's log:\n%s\nsecond sidecar's log:\n%s", tail(firstLogs.String(), 400), tail(secondLogs.String(), 400))
		}
	})

	testkit.Eventually(t, 60*time.Second, "a third of the records", func() bool { return len(a.allCalls()) >= n/3 })
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	killedAt := len(a.allCalls())

	seen := func() map[string]int {
		m := map[string]int{}
		for _, c := range a.allCalls() {
			m[c.Header.Get("Ce-Id")]++
		}
		return m
	}
	testkit.Eventually(t, 90*time.Second, "every record after the kill", func() bool { return len(seen()) == n })
	// Every record called is not every partition taken over: the killed
	// one may have called a partition's last records without committing
	// them, and its partitions move only after its session timeout. The
	// survivor commits as it goes; wait for its commits to reach the end.
	testkit.Eventually(t, 90*time.Second, "the survivor's commits at every partition's log end", func() bool {
		return len(committedBehind(t, brokers, topic)) == 0
	})
	if err := second.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.Wait(); err != nil {
		t.Errorf("surviving sidecar exited with %v; log:\n%s", err, tail(secondLogs.String(), 30))
	}

	dups := 0
	for _, k := range seen() {
		dups += k - 1
	}
	calls := map[string]int{}
	unflagged := 0
	for _, c := range a.allCalls() {
		id := c.Header.Get("Ce-Id")
		if calls[id]++; calls[id] > 1 && c.Header.Get("Handoff-Redelivered") != "true" {
			unflagged++
			if unflagged <= 5 {
				t.Errorf("record %s (partition/offset %s) called again without Handoff-Redelivered: true (call %d, attempt %s)", id, where[id], calls[id], c.Header.Get("Handoff-Attempt"))
			}
		}
	}
	if unflagged > 5 {
		t.Errorf("... %d repeated calls unflagged in all", unflagged)
	}
	t.Logf("%d records over 6 partitions, first sidecar killed after %d calls: %d calls in all, %d records handed over twice",
		n, killedAt, len(a.allCalls()), dups)
	if killedAt >= n {
		t.Fatal("the stream ended before the kill; the test proves nothing")
	}

	checkCommittedAtLogEnd(t, brokers, topic)
}
