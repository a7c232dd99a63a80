package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"sort"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/testkit"
)

// Dead letters through a replica's death and a version's upgrade: a replay
// taken over after its runner's SIGKILL, and a quorum Q.dlq moved into the
// stream.

// A replica killed halfway through the replay it runs: another replica
// takes the replay over once its heartbeat is stale and finishes it; every
// selected dead letter ends done.
func TestReplayTakenOverAfterSIGKILLRabbitMQ(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	conn := dialRabbit(t)
	t.Cleanup(func() { _ = conn.Close() })
	q := testQueue(t, conn, []time.Duration{200 * time.Millisecond})
	var broken atomic.Bool
	broken.Store(true)
	a := brokenApp(t, &broken)
	tok := tokenFile(t, adminTestToken, 0o600)
	replica := func(name string) (*exec.Cmd, adminv1.AdminClient, *bytes.Buffer) {
		addr := freeAddr(t)
		cfg := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 8}
sources:
  - name: test
    rabbitmq: {url: %q, queue: %q, prefetch: 8}
retry: {max_attempts: 2, tiers: [200ms], base: 50ms, cap: 200ms}
telemetry: {metrics_listen: ""}
admin: {listen: %q, token_file: %q, token_name: %s}
journal: {path: %q}
deadletter: {poll: 100ms, replay_takeover: 2s}
`, a.url(), brokertest.RabbitURL(), q, addr, tok, name, filepath.Join(t.TempDir(), name+".db")))
		var logs bytes.Buffer
		cmd := exec.Command(bin, "run", "--config", cfg)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("%s's log:\n%s", name, tail(logs.String(), 6000))
			}
		})
		c := grpcAdmin(t, addr)
		testkit.Eventually(t, 20*time.Second, name+"'s admin API", func() bool {
			_, err := c.GetStatus(authed, &adminv1.GetStatusRequest{})
			return err == nil
		})
		return cmd, c, &logs
	}
	runnerCmd, ca, _ := replica("replica-a")
	_, cb, _ := replica("replica-b")

	events := ids("perm", 30)
	publishIDs := make([]publishing, len(events))
	for i, id := range events {
		publishIDs[i] = publishing{MessageId: id, ContentType: "application/json", Body: []byte(`{"order":"` + id + `"}`)}
	}
	publish(t, conn, q, publishIDs...)
	waitCounts(t, ca, map[string]int64{"pending": 30})
	for _, l := range allLetters(t, ca) {
		if _, err := ca.ApproveDeadLetter(authed, &adminv1.ApproveDeadLetterRequest{Id: l.GetId(), Reason: "fixed"}); err != nil {
			t.Fatal(err)
		}
	}
	broken.Store(false)
	run, err := ca.CreateReplay(authed, &adminv1.CreateReplayRequest{Source: "test", RatePerSecond: 10, BatchSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	if run.GetRunner() == "" {
		t.Fatalf("the replica that created the replay does not run it: %v", run)
	}
	testkit.Eventually(t, 20*time.Second, "half the replay", func() bool { return len(replayCalls(a, run.GetId())) >= 12 })
	if err := runnerCmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = runnerCmd.Wait()
	killed := time.Now()
	t.Logf("killed the runner after %d replayed events", len(replayCalls(a, run.GetId())))

	final := waitReplay(t, cb, run.GetId(), 60*time.Second)
	if final.GetState() != "completed" || final.GetRunner() == run.GetRunner() || final.GetProgress().GetHandled() != 30 {
		t.Fatalf("replay after the kill: %v", final)
	}
	t.Logf("replica-b finished the replay %v after the kill", time.Since(killed).Round(time.Millisecond))
	waitCounts(t, cb, map[string]int64{"done": 30})
	calls := replayCalls(a, run.GetId())
	if len(calls) != 30 {
		t.Fatalf("%d of 30 events replayed", len(calls))
	}
	var twice []string
	for ev, cs := range calls {
		if len(cs) > 1 {
			twice = append(twice, fmt.Sprintf("%s ×%d", ev, len(cs)))
		}
	}
	sort.Strings(twice)
	// The windows a kill leaves: a copy published and confirmed whose
	// Replay record the runner had not appended (published again by the
	// taker), and a copy the killed replica's engine had in hand, unacked
	// (redelivered to the other replica). Each holds at most what was in
	// flight at the kill.
	t.Logf("events the app saw more than once: %d %v", len(twice), twice)
	if len(twice) > 8 {
		t.Fatalf("%d events replayed more than once: more than was in flight at the kill", len(twice))
	}
}

// A quorum Q.dlq holding dead letters from before the dead-letter stream is
// moved into the stream when the sidecar starts, and its dead letters are
// listed as pending.
func TestQuorumDeadLetterQueueMigratedAndListedRabbitMQ(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	t.Cleanup(func() { _ = conn.Close() })
	tiers := []time.Duration{200 * time.Millisecond}
	q := testQueue(t, conn, tiers)
	dlq := rabbitmq.DeadLetterQueue(q)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(dlq, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		t.Fatal(err)
	}
	_ = ch.Close()
	var old []publishing
	for i := range 30 {
		tr := broker.Trail{EventID: fmt.Sprintf("old-%02d", i), Attempt: 3, Hops: 3, DeadReason: "max-attempts",
			ErrorClass: "retry", Error: "503 Service Unavailable", FirstFailureAt: time.Now().Add(-time.Hour)}
		h := amqp.Table{}
		for k, v := range tr.Headers() {
			h[k] = v
		}
		old = append(old, publishing{MessageId: tr.EventID, ContentType: "application/json", Headers: h, Body: []byte(`{"n":` + fmt.Sprint(i) + `}`)})
	}
	publish(t, conn, dlq, old...)

	a := newApp(t, status(http.StatusOK))
	s := startSidecar(t, dlqConfig(testConfig(a.url(), q, tiers...), t))
	c := grpcAdmin(t, s.admin)
	waitCounts(t, c, map[string]int64{"pending": 30})
	letters := allLetters(t, c, "pending")
	for i, l := range letters {
		if l.GetEventId() != fmt.Sprintf("old-%02d", i) || l.GetReason() != "max-attempts" || l.GetAttempts() != 3 {
			t.Fatalf("migrated dead letter %d: %v", i, l)
		}
	}
	if got := len(readStream(t, conn, dlq)); got != 30 {
		t.Fatalf("the dead-letter stream holds %d, want the 30 moved into it", got)
	}
	l, err := c.GetDeadLetter(authed, &adminv1.GetDeadLetterRequest{Id: letters[7].GetId()})
	if err != nil || string(l.GetBody()) != `{"n":7}` {
		t.Fatalf("migrated body: %v, %v", l, err)
	}
}
