package main

import (
	"bytes"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// The outcome contract with batch delivery on RabbitMQ: one mixed batch,
// and every message in it keeps its own outcome, attempts, retry and
// dead-letter path.
// It runs against an HTTP app and against a gRPC app that says the same with
// outcomes and status codes.
func TestRabbitBatchOutcomeContract(t *testing.T) {
	t.Parallel()
	for _, tr := range []string{"http", "grpc"} {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			testRabbitBatchOutcomeContract(t, tr)
		})
	}
}

func testRabbitBatchOutcomeContract(t *testing.T, transport string) {
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a, url := scriptApp(t, transport, contractScript)
	cfg := testConfig(url, q, tier)
	cfg.Retry.MaxAttempts = 3
	cfg.Handler.Batch = config.Batch{MaxMessages: 8, MaxWait: config.Duration(50 * time.Millisecond)}
	s := startSidecar(t, cfg)

	ids := []string{"ok", "flaky", "poison", "gone", "broken"}
	var msgs []publishing
	for _, id := range ids {
		msgs = append(msgs, publishing{MessageId: id, ContentType: "application/octet-stream", Body: []byte("body-" + id)})
	}
	publish(t, conn, q, msgs...)
	dlq := rabbitmq.DeadLetterQueue(q)
	testkit.Eventually(t, 20*time.Second, "every outcome", func() bool {
		return len(a.callsFor("flaky")) == 2 && len(a.callsFor("broken")) == 3 && len(readStream(t, conn, dlq)) == 2
	})
	time.Sleep(3 * tier)
	s.stop(t)

	for id, want := range map[string]int{"ok": 1, "flaky": 2, "poison": 1, "gone": 1, "broken": 3} {
		if n := len(a.callsFor(id)); n != want {
			t.Errorf("%s: %d calls, want %d", id, n, want)
		}
	}
	if f := a.callsFor("flaky"); len(f) == 2 && (f[1].Header.Get("Handoff-Attempt") != "2" || f[1].At.Sub(f[0].At) < tier) {
		t.Errorf("flaky: second call attempt %q after %v, want 2 after >= %v", f[1].Header.Get("Handoff-Attempt"), f[1].At.Sub(f[0].At), tier)
	}
	if c := a.callsFor("ok"); len(c) == 1 && !bytes.Equal(c[0].Body, []byte("body-ok")) {
		t.Errorf("the app got body %q, want the message's", c[0].Body)
	}
	reasons := map[string]string{}
	for _, d := range readStream(t, conn, dlq) {
		id, _ := d.Headers[broker.HeaderEventID].(string)
		reasons[id], _ = d.Headers[broker.HeaderDeadReason].(string)
		if string(d.Body) != "body-"+id {
			t.Errorf("DLQ copy of %s has body %q", id, d.Body)
		}
	}
	if len(reasons) != 2 || reasons["poison"] != "permanent" || reasons["broken"] != "max-attempts" {
		t.Errorf("DLQ reasons = %v, want poison: permanent, broken: max-attempts", reasons)
	}
	if a.largestBatch() < 2 {
		t.Errorf("no request carried more than %d message", a.largestBatch())
	}
	if n := depth(t, conn, q); n != 0 {
		t.Errorf("source holds %d, want 0", n)
	}
}
