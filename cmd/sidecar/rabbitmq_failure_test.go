package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// TestRabbitConnectionsClosedMidStream force-closes every connection of the
// sidecar's vhost while it consumes: it must reconnect, resume, and hand
// every message to the app; nothing is lost.
func TestRabbitConnectionsClosedMidStream(t *testing.T) {
	t.Parallel()
	url := testVhost(t)
	conn := dialRabbitURL(t, url)
	q := testQueue(t, conn, []time.Duration{tier})
	// Three times, after the 60th, 140th and 220th call, the app stalls
	// until the connections are closed, so each close lands mid-stream with
	// deliveries in flight.
	stalls := []int32{60, 140, 220}
	releases := make([]chan struct{}, len(stalls))
	for i := range releases {
		releases[i] = make(chan struct{})
	}
	var calls atomic.Int32
	a := newApp(t, func(w http.ResponseWriter, _ call, _ []call) {
		n := calls.Add(1)
		for i := len(stalls) - 1; i >= 0; i-- {
			if n > stalls[i] {
				select {
				case <-releases[i]:
				case <-time.After(30 * time.Second):
				}
				break
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	cfg := testConfig(a.url(), q, tier)
	cfg.Sources[0].RabbitMQ.URL = url
	s := startSidecar(t, cfg)

	const n = 300
	var msgs []publishing
	for i := range n {
		msgs = append(msgs, publishing{MessageId: fmt.Sprintf("m-%03d", i), Body: []byte("x")})
	}
	publish(t, conn, q, msgs...)
	conn.Close() // ours goes too at the first close; reopened after
	var closedAt []int
	for i, at := range stalls {
		testkit.Eventually(t, 30*time.Second, fmt.Sprintf("call %d", at), func() bool { return calls.Load() >= at })
		rabbitmqctl(t, "close_all_connections", "-p", cfg.Sources[0].RabbitMQ.URL[len(brokertest.RabbitURL()):], "test: broker-side close")
		closedAt = append(closedAt, len(a.allCalls()))
		close(releases[i])
	}

	seen := func() map[string]int {
		m := map[string]int{}
		for _, c := range a.allCalls() {
			m[c.Header.Get("Ce-Id")]++
		}
		return m
	}
	testkit.Eventually(t, 60*time.Second, "every message after the reconnect", func() bool { return len(seen()) == n })
	s.stop(t)

	dups, unflagged := 0, 0
	for _, k := range seen() {
		dups += k - 1
	}
	first := map[string]bool{}
	for _, c := range a.allCalls() {
		id := c.Header.Get("Ce-Id")
		if first[id] && c.Header.Get("Handoff-Redelivered") != "true" {
			unflagged++
		}
		first[id] = true
	}
	t.Logf("%d messages, closes after %v calls, %d calls in all, %d duplicate calls (in flight at a close, redelivered), %d of them not flagged",
		n, closedAt, len(a.allCalls()), dups, unflagged)
	if unflagged != 0 {
		t.Errorf("%d repeated calls did not say Handoff-Redelivered: true", unflagged)
	}
	if closedAt[len(closedAt)-1] >= n {
		t.Fatalf("the stream finished before the last close; the test proves little")
	}
	conn = dialRabbitURL(t, url)
	for _, name := range []string{q, rabbitmq.RetryQueue(q), rabbitmq.DeadLetterQueue(q)} {
		if got := depth(t, conn, name); got != 0 {
			t.Errorf("%s holds %d after the stream, want 0", name, got)
		}
	}
	if dups > len(stalls)*cfg.Sources[0].RabbitMQ.Prefetch*2 {
		t.Errorf("%d duplicates: more than the deliveries that could have been in flight", dups)
	}
}

// TestRabbitDeadLetterQueueDeleted deletes the DLQ under a running sidecar:
// the dead-letter transfer is returned unroutable, so the source message must
// stay unacked — handed back at shutdown — and reach the DLQ once it exists.
func TestRabbitDeadLetterQueueDeleted(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, status(http.StatusUnprocessableEntity))
	cfg := testConfig(a.url(), q, tier)
	cfg.Shutdown.DrainTimeout = config.Duration(time.Second)
	cfg.Journal.Path = filepath.Join(t.TempDir(), "handoff.db") // kept across the restart
	s := startSidecar(t, cfg)

	dlq := rabbitmq.DeadLetterQueue(q)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(dlq, false, false, false); err != nil {
		t.Fatal(err)
	}
	ch.Close()

	publish(t, conn, q, publishing{MessageId: "m-dlq", Body: []byte("poison")})
	testkit.Eventually(t, 10*time.Second, "the app call", func() bool { return len(a.callsFor("m-dlq")) == 1 })
	time.Sleep(time.Second) // several transfer attempts fail meanwhile
	if exists(conn, dlq) {
		t.Fatal("the DLQ came back while the sidecar ran; the test proves nothing")
	}
	s.stop(t)
	testkit.Eventually(t, 5*time.Second, "the message back in the source queue", func() bool { return depth(t, conn, q) == 1 })

	// A restart declares the topology again; the message reaches the DLQ,
	// and the journal knows the app already answered: it is not called again.
	startSidecar(t, cfg)
	testkit.Eventually(t, 10*time.Second, "the DLQ copy", func() bool { return len(readStream(t, conn, dlq)) == 1 })
	d := readStream(t, conn, dlq)[0]
	if d.Headers[broker.HeaderEventID] != "m-dlq" || d.Headers[broker.HeaderDeadReason] != "permanent" {
		t.Errorf("DLQ copy headers = %v", d.Headers)
	}
	if got := depth(t, conn, q); got != 0 {
		t.Errorf("source holds %d, want 0", got)
	}
	if n := len(a.callsFor("m-dlq")); n != 1 {
		t.Errorf("app called %d times, want 1: the journal recorded its answer", n)
	}
}

// TestReadyzFollowsRabbitMQ: /readyz says 503 while RabbitMQ cannot be
// reached (the sidecar's user lost its access to the vhost and its
// connections were closed) and 200 once it can be again.
func TestReadyzFollowsRabbitMQ(t *testing.T) {
	t.Parallel()
	url := testVhost(t)
	vhost := url[len(strings.TrimSuffix(brokertest.RabbitURL(), "/"))+1:]
	conn := dialRabbitURL(t, url)
	q := testQueue(t, conn, []time.Duration{tier})
	conn.Close()
	a := newApp(t, status(http.StatusOK))
	cfg := testConfig(a.url(), q, tier)
	cfg.Sources[0].RabbitMQ.URL = url
	s := startSidecar(t, cfg)
	if code, body := readyz(t, s.health); code != http.StatusOK {
		t.Fatalf("/readyz %d while connected: %s", code, body)
	}
	rabbitmqctl(t, "clear_permissions", "-p", vhost, "guest")
	rabbitmqctl(t, "close_all_connections", "-p", vhost, "test: broker unreachable")
	testkit.Eventually(t, 20*time.Second, "/readyz 503 while RabbitMQ refuses the sidecar", func() bool {
		code, _ := readyz(t, s.health)
		return code == http.StatusServiceUnavailable
	})
	rabbitmqctl(t, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
	testkit.Eventually(t, 30*time.Second, "/readyz 200 once RabbitMQ takes the sidecar back", func() bool {
		code, _ := readyz(t, s.health)
		return code == http.StatusOK
	})
}
