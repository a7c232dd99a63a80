package main

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/budget"
)

// TestCrashLoopUnderDeliveryLimitRabbitMQ runs a crash loop against a quorum
// queue with a delivery limit: one message of 30 makes its sidecar die
// (SIGKILL during the call) on every call, and the sidecar is started again
// on its journal each time, as a pod's container restarts. Every kill
// returns the whole unacked window to the queue and each return counts; the
// queue drops a message returned more than x-delivery-limit times. Twenty
// runs, half killing at once and half 100 ms into the call: nothing is
// lost, the killing message ends in the DLQ as delivery-limit each time, and
// every healthy message is handled, none dead-lettered.
func TestCrashLoopUnderDeliveryLimitRabbitMQ(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	// Four runs at a time: each is a sidecar process and its restarts.
	slots := make(chan struct{}, 4)
	for i := range 20 {
		after := time.Duration(0)
		if i%2 == 1 {
			after = 100 * time.Millisecond
		}
		t.Run(fmt.Sprintf("run=%d/kill-after=%v", i, after), func(t *testing.T) {
			t.Parallel()
			slots <- struct{}{}
			defer func() { <-slots }()
			crashLoopRun(t, bin, after)
		})
	}
}

// crashLoopLimit is the queue's x-delivery-limit: the message is dropped on
// its fifth return.
const crashLoopLimit = 3

func crashLoopRun(t *testing.T, bin string, killAfter time.Duration) {
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{killTier})
	// The limit by policy would apply to the retry queue too; by argument,
	// as here, to the source queue only (Q.retry is declared without one).
	limitQueue(t, conn, q, crashLoopLimit)

	a := newKillerApp(t, killAfter)
	cfgPath := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 8}
sources:
  - name: loop
    rabbitmq: {url: %q, queue: %q, delivery_limit: %d}
retry: {max_attempts: 10, tiers: [%s], base: 50ms, cap: 200ms}
telemetry: {metrics_listen: ""}
journal: {path: %q}
`, a.url(), brokertest.RabbitURL(), q, crashLoopLimit, killTier, filepath.Join(t.TempDir(), "handoff.db")))

	var ids []string
	var msgs []publishing
	for i := range 30 {
		id := fmt.Sprintf("ok-%d", i)
		if i == 10 {
			id = "killer"
		}
		ids = append(ids, id)
		msgs = append(msgs, publishing{MessageId: id, Body: []byte(id), DeliveryMode: amqp.Persistent})
	}
	publish(t, conn, q, msgs...)

	dlq := rabbitmq.DeadLetterQueue(q)
	done := func() bool {
		handled := a.handled()
		if handled < len(ids)-1 || len(readStream(t, conn, dlq)) == 0 {
			return false
		}
		for _, name := range []string{q, rabbitmq.RetryQueue(q), rabbitmq.TierQueue(q, killTier)} {
			if depth(t, conn, name) != 0 {
				return false
			}
		}
		return true
	}
	var logs bytes.Buffer
	starts := restartUntil(t, bin, cfgPath, a, &logs, done)

	var dead []string
	for _, d := range readStream(t, conn, dlq) {
		id, _ := d.Headers[broker.HeaderEventID].(string)
		reason, _ := d.Headers[broker.HeaderDeadReason].(string)
		dead = append(dead, id+"/"+reason)
		if id != "killer" {
			t.Errorf("healthy message %s dead-lettered (%s)", id, reason)
		}
		if id == "killer" && reason != string(budget.ReasonDeliveryLimit) {
			t.Errorf("the killing message dead-lettered as %q, want %q", reason, budget.ReasonDeliveryLimit)
		}
		if _, ok := d.Headers[deliveryCountHeaderName].(int64); ok {
			t.Errorf("dead letter %s carries the queue's %s", id, deliveryCountHeaderName)
		}
	}
	if len(dead) != 1 {
		t.Errorf("dead letters %v, want the killing message once", dead)
	}
	for _, id := range ids {
		if id != "killer" && !a.succeeded(id) {
			t.Errorf("lost: %s was never handled", id)
		}
	}
	t.Logf("%d starts, %d calls of the killing message, dead letters %v", starts, a.killerCalls(), dead)
}

// deliveryCountHeaderName is the header a quorum queue counts deliveries in.
const deliveryCountHeaderName = "x-delivery-count"

// limitQueue declares q again with a delivery limit: a quorum queue's
// arguments cannot change, so it is deleted first (it is still empty).
func limitQueue(t *testing.T, conn *amqp.Connection, q string, limit int) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDelete(q, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{
		amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-delivery-limit": int64(limit),
	}); err != nil {
		t.Fatal(err)
	}
}

// killerApp is the crash loops' app: the message "killer" SIGKILLs the
// sidecar in its call (after killAfter), every other one succeeds after
// 5 ms, so that several are in flight together.
type killerApp struct {
	*app
	cur   atomic.Pointer[exec.Cmd] // the sidecar running now, for the killer to kill
	mu    sync.Mutex
	ok    map[string]int // successes by id
	calls int            // of the killer
}

func newKillerApp(t *testing.T, killAfter time.Duration) *killerApp {
	k := &killerApp{ok: map[string]int{}}
	k.app = newApp(t, func(w http.ResponseWriter, c call, _ []call) {
		id := c.Header.Get("Ce-Id")
		if id == "killer" {
			k.mu.Lock()
			k.calls++
			k.mu.Unlock()
			time.Sleep(killAfter)
			if cmd := k.cur.Load(); cmd != nil {
				_ = cmd.Process.Signal(syscall.SIGKILL)
			}
			return
		}
		time.Sleep(5 * time.Millisecond) // in flight together
		k.mu.Lock()
		k.ok[id]++
		k.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	return k
}

// handled is how many messages succeeded; succeeded whether id did.
func (k *killerApp) handled() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.ok)
}

func (k *killerApp) succeeded(id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ok[id] > 0
}

func (k *killerApp) killerCalls() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.calls
}

// restartUntil runs the sidecar on cfgPath and starts it again each time it
// exits (a's killer kills it), as a pod's container restarts, until done
// holds or one run sits idle for 30 s (something the broker dropped leaves
// it waiting for nothing: the caller's checks then say what is missing).
// It returns the number of starts.
func restartUntil(t *testing.T, bin, cfgPath string, a *killerApp, logs *bytes.Buffer, done func() bool) int {
	t.Helper()
	const maxStarts = 20
	starts := 0
	for !done() {
		if starts == maxStarts {
			path := filepath.Join(os.TempDir(), "handoff-"+strings.ReplaceAll(t.Name(), "/", "-")+".log")
			_ = os.WriteFile(path, logs.Bytes(), 0o644)
			t.Fatalf("not settled after %d starts (%d killer calls); log in %s", starts, a.killerCalls(), path)
		}
		starts++
		cmd := exec.Command(bin, "run", "--config", cfgPath)
		cmd.Stderr = logs
		// Published only once started: the app's handler reads cmd.Process,
		// which Start writes.
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		a.cur.Store(cmd)
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		// Until the app kills it, or nothing is left to do.
		idleUntil := time.Now().Add(30 * time.Second)
		for stop := false; !stop; {
			select {
			case <-exited:
				stop = true
			case <-time.After(100 * time.Millisecond):
				if done() || time.Now().After(idleUntil) {
					_ = cmd.Process.Signal(syscall.SIGTERM)
					<-exited
					stop = true
				}
			}
		}
		a.cur.Store(nil)
		if !done() && time.Now().After(idleUntil) {
			break
		}
	}
	return starts
}
