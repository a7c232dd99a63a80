package main

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/testkit"
)

// rabbitLocal runs scripts/rabbitmq-local with args.
func rabbitLocal(t *testing.T, args ...string) {
	t.Helper()
	localScript(t, "rabbitmq-local", "RabbitMQ", args...)
}

// localScript runs one of the scripts that start the local brokers, which a
// test under -short does not get to.
func localScript(t *testing.T, script, needs string, args ...string) {
	t.Helper()
	brokertest.SkipShort(t, needs)
	out, err := exec.Command(filepath.Join("..", "..", "scripts", script), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/%s %v: %v\n%s", script, args, err, out)
	}
}

// TestRabbitMQRestartUnderLoad stops and restarts a RabbitMQ node (one of
// its own, so the other tests' broker stays up) while the sidecar works
// through a mixed backlog with deliveries in flight, transfers to a retry
// tier and dead-letter copies on the way: every message ends handled or
// (poison only) dead-lettered once, and every repeated call is flagged.
func TestRabbitMQRestartUnderLoad(t *testing.T) {
	t.Parallel()
	const node, port = "handoff-restart", "5682"
	rabbitLocal(t, "start-node", node, port)
	t.Cleanup(func() { rabbitLocal(t, "delete-node", node) })
	url := "amqp://guest:guest@127.0.0.1:" + port + "/"
	conn := dialRabbitURL(t, url)
	q := testQueue(t, conn, []time.Duration{killTier})

	l := newLedgerApp(t, 3*time.Millisecond)
	cfg := testConfig(l.url(), q, killTier)
	cfg.Sources[0].RabbitMQ.URL = url
	cfg.Retry.MaxAttempts = 10 // a call cut off by the restart is an attempt
	startSidecar(t, cfg)

	ids := mixedWorkload(1500)
	var msgs []publishing
	for _, id := range ids {
		msgs = append(msgs, publishing{MessageId: id, Body: []byte(id)})
	}
	publish(t, conn, q, msgs...)
	testkit.Eventually(t, 60*time.Second, "a third handled", func() bool { return l.handled() >= len(ids)/3 })
	rabbitLocal(t, "stop-node", node)
	stoppedAt := l.handled()
	rabbitLocal(t, "start-node", node, port)
	if stoppedAt >= len(ids)*9/10 {
		t.Fatalf("%d of %d handled before the broker stopped; the test proves little", stoppedAt, len(ids))
	}

	conn = dialRabbitURL(t, url)
	poison := len(ids) / 10
	testkit.Eventually(t, 120*time.Second, "every message handled or dead-lettered", func() bool {
		return l.handled() == len(ids)-poison && depth(t, conn, q) == 0 && depth(t, conn, rabbitmq.RetryQueue(q)) == 0 &&
			len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))) >= poison
	})
	dead := idsOf(readStream(t, conn, rabbitmq.DeadLetterQueue(q)), func(d amqp.Delivery) string { return d.MessageId })
	t.Logf("broker stopped after %d handled", stoppedAt)
	// In flight when the node stopped: what the app had in hand and what was
	// handled but not yet acked, at most a prefetch per consumer.
	l.account(t, "RabbitMQ restarted", ids, dead, 2*cfg.Sources[0].RabbitMQ.Prefetch)
}
