package main

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

// Three sidecars, each with a journal and an app of its own, share a topic
// of one partition through a share group — more members than partitions,
// which a consumer group would leave two of idle — and each handles a
// substantial part of it. One is SIGKILLed mid-stream: the records it held
// go back to the group as its connection closes, the two others handle
// them, flagged redelivered by the brokers' delivery count, and nothing is
// lost; the group has nothing left at the end.
func TestKafkaShareGroupThreeSidecarsOneKilled(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	brokers, topic := realKafkaTopic(t, "share3", 1)
	group := kafkaGroup(topic)
	apps := make([]*app, 3)
	for i := range apps {
		apps[i] = newApp(t, func(w http.ResponseWriter, _ call, _ []call) {
			time.Sleep(2 * time.Millisecond)
			w.WriteHeader(http.StatusOK)
		})
	}
	start := func(i int) (*exec.Cmd, *lockedBuffer) {
		path := shareMemberConfig(t, "max_concurrency: 8", apps[i].url(), brokers, topic, group)
		var logs lockedBuffer
		cmd := exec.Command(bin, "run", "--config", path)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, &logs
	}
	cmds := make([]*exec.Cmd, 3)
	logs := make([]*lockedBuffer, 3)
	for i := range cmds {
		cmds[i], logs[i] = start(i)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, l := range logs {
				t.Logf("sidecar %d's log:\n%s", i, tail(l.String(), 30))
			}
		}
	})
	// The records come once the three have joined: the first alone would
	// otherwise take the lot before the others are assigned.
	testkit.Eventually(t, 60*time.Second, "three members assigned the partition", func() bool {
		return brokertest.KafkaShareMembers(t, brokers, group) == 3
	})
	const n = 3000
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprint(i)),
			Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(fmt.Sprintf("r-%05d", i))}}})
	}
	produceKafka(t, brokers, recs...)

	calls := func() (all []call, per []int) {
		for _, a := range apps {
			c := a.allCalls()
			all = append(all, c...)
			per = append(per, len(c))
		}
		return all, per
	}
	testkit.Eventually(t, 60*time.Second, "a third of the records", func() bool { all, _ := calls(); return len(all) >= n/3 })
	if err := cmds[0].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmds[0].Wait()
	_, atKill := calls()
	killedAt := atKill[0] + atKill[1] + atKill[2]

	seen := func() map[string]int {
		all, _ := calls()
		m := map[string]int{}
		for _, c := range all {
			m[c.Header.Get("Ce-Id")]++
		}
		return m
	}
	testkit.Eventually(t, 90*time.Second, "every record after the kill", func() bool { return len(seen()) == n })
	checkShareGroupDone(t, brokers, topic, group, 1)
	for _, i := range []int{1, 2} {
		if err := cmds[i].Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := cmds[i].Wait(); err != nil {
			t.Errorf("sidecar %d exited with %v", i, err)
		}
	}

	all, per := calls()
	count := map[string]int{}
	unflagged := 0
	for _, c := range all {
		id := c.Header.Get("Ce-Id")
		if count[id]++; count[id] > 1 && c.Header.Get("Handoff-Redelivered") != "true" {
			unflagged++
		}
	}
	t.Logf("%d records on one partition, three sidecars, the first killed after %d calls (%v each): %d calls in all, %v each",
		n, killedAt, atKill, len(all), per)
	if killedAt >= n {
		t.Fatal("the stream ended before the kill; the test proves nothing")
	}
	if unflagged != 0 {
		t.Errorf("%d repeated calls did not say Handoff-Redelivered: true", unflagged)
	}
	// A substantial part each: at least a sixth of the calls made while all
	// three ran (an even share is a third).
	for i, k := range atKill {
		if k < killedAt/6 {
			t.Errorf("sidecar %d had made %d of the %d calls when the first was killed (%v); want each a substantial part", i, k, killedAt, atKill)
		}
	}
}

// A call that outlives the record's lock keeps the record: its sidecar
// renews the lock while the call runs, so the other member of the share
// group never gets it, and it is handled once. The lock is set on the
// group, 2 s, and the call takes 7 s.
func TestKafkaShareGroupLongCallRenewed(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	brokers, topic := realKafkaTopic(t, "renew", 1)
	group := kafkaGroup(topic)
	setGroupConfig(t, brokers, group, "share.record.lock.duration.ms", "2000")
	const hold = 7 * time.Second
	apps := make([]*app, 2)
	for i := range apps {
		apps[i] = newApp(t, func(w http.ResponseWriter, c call, _ []call) {
			if c.Header.Get("Ce-Id") == "slow" {
				time.Sleep(hold)
			}
			w.WriteHeader(http.StatusOK)
		})
	}
	var logs [2]lockedBuffer
	for i := range apps {
		path := shareMemberConfig(t, "timeout: 30s", apps[i].url(), brokers, topic, group)
		cmd := exec.Command(bin, "run", "--config", path)
		cmd.Stderr = &logs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	}
	testkit.Eventually(t, 60*time.Second, "both members assigned the partition", func() bool {
		return brokertest.KafkaShareMembers(t, brokers, group) == 2
	})
	produceKafka(t, brokers, &kgo.Record{Topic: topic, Value: []byte("slow"), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte("slow")}}})
	slowCalls := func() (n int, redelivered bool) {
		for _, a := range apps {
			for _, c := range a.allCalls() {
				if c.Header.Get("Ce-Id") == "slow" {
					n++
					redelivered = redelivered || c.Header.Get("Handoff-Redelivered") == "true"
				}
			}
		}
		return n, redelivered
	}
	testkit.Eventually(t, 30*time.Second, "the slow call started", func() bool { n, _ := slowCalls(); return n >= 1 })
	checkShareGroupDone(t, brokers, topic, group, 1) // waits up to 30 s for its accept
	if n, redelivered := slowCalls(); n != 1 || redelivered {
		t.Fatalf("the slow record was called %d times (redelivered: %v); want once, its lock renewed through the %v call", n, redelivered, hold)
	}
	for i := range logs {
		if !strings.Contains(logs[i].String(), `"lock_duration":"2s"`) {
			t.Errorf("sidecar %d did not read the group's lock of 2s; log:\n%s", i, tail(logs[i].String(), 20))
		}
	}
}

// shareMemberConfig writes the config of one of several sidecars in share
// group group, each with a journal of its own; handler is added to the
// handler's settings.
func shareMemberConfig(t *testing.T, handler, appURL string, brokers []string, topic, group string) string {
	return writeFile(t, fmt.Sprintf(`handler: {url: %q, %s}
sources:
  - name: shared
    kafka: {brokers: [%q], topic: %q, share_group: %q}
retry: {tiers: [1s]}
telemetry: {metrics_listen: ""}
journal: {path: %q}
`, appURL, handler, strings.Join(brokers, ","), topic, group, filepath.Join(t.TempDir(), "sidecar.db")))
}
