package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// These tests run the whole sidecar (serve) against the real RabbitMQ and a
// scripted HTTP app on loopback, one fresh queue each.

const tier = 400 * time.Millisecond

func TestRabbitSuccessAckedOnce(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, status(http.StatusOK))
	s := startSidecar(t, testConfig(a.url(), q, tier))

	publish(t, conn, q, publishing{
		MessageId:   "m-1",
		ContentType: "application/json",
		Type:        "order.created",
		Body:        []byte(`{"n":1}`),
		Headers:     amqp.Table{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-tenant": "acme", "count": int32(7)},
	})
	testkit.Eventually(t, 10*time.Second, "the app call", func() bool { return len(a.callsFor("m-1")) == 1 })
	s.stop(t)

	c := a.callsFor("m-1")[0]
	for k, want := range map[string]string{
		"Ce-Id": "m-1", "Ce-Specversion": "1.0", "Ce-Type": "order.created", "Ce-Source": "/rabbitmq/" + q,
		"Content-Type": "application/json", "Handoff-Attempt": "1", "Handoff-Redelivered": "false",
		"Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "X-Tenant": "acme", "Count": "7",
	} {
		if got := c.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	dl, err := time.Parse(time.RFC3339, c.Header.Get("Handoff-Deadline"))
	if err != nil || dl.Before(time.Now().Add(50*time.Minute)) {
		t.Errorf("Handoff-Deadline = %q (%v), want about an hour ahead", c.Header.Get("Handoff-Deadline"), err)
	}
	if string(c.Body) != `{"n":1}` {
		t.Errorf("body = %q", c.Body)
	}
	if n := len(a.allCalls()); n != 1 {
		t.Errorf("app called %d times, want 1", n)
	}
	for _, name := range []string{q, rabbitmq.RetryQueue(q), rabbitmq.DeadLetterQueue(q)} {
		if n := depth(t, conn, name); n != 0 {
			t.Errorf("%s holds %d messages after a success, want 0 (acked once)", name, n)
		}
	}
}

func TestRabbitTransientThenSuccess(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier, 2 * tier})
	a := newApp(t, func(w http.ResponseWriter, _ call, prior []call) {
		if len(prior) == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	startSidecar(t, testConfig(a.url(), q, tier, 2*tier))

	publish(t, conn, q, publishing{MessageId: "m-2", Body: []byte("x")})
	testkit.Eventually(t, 10*time.Second, "two calls", func() bool { return len(a.callsFor("m-2")) == 2 })
	time.Sleep(3 * tier) // a third call would come by now

	calls := a.callsFor("m-2")
	if len(calls) != 2 {
		t.Fatalf("app called %d times, want 2", len(calls))
	}
	for i, c := range calls {
		if got := c.Header.Get("Handoff-Attempt"); got != strconv.Itoa(i+1) {
			t.Errorf("call %d: Handoff-Attempt = %q, want %d", i+1, got, i+1)
		}
		if got := c.Header.Get("Ce-Id"); got != "m-2" {
			t.Errorf("call %d: ce-id = %q, want m-2", i+1, got)
		}
	}
	if gap := calls[1].At.Sub(calls[0].At); gap < tier {
		t.Errorf("second call %v after the first, want no earlier than the smallest tier %v", gap, tier)
	}
	if d1, d2 := calls[0].Header.Get("Handoff-Deadline"), calls[1].Header.Get("Handoff-Deadline"); d1 != d2 {
		t.Errorf("deadline moved between hops: %s then %s", d1, d2)
	}
	if n := len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))); n != 0 {
		t.Errorf("DLQ holds %d, want 0", n)
	}
}

func TestRabbitPermanentDeadLetters(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, func(w http.ResponseWriter, _ call, _ []call) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = w.Write([]byte("field 'sku' is required"))
	})
	startSidecar(t, testConfig(a.url(), q, tier))

	body := []byte{0x00, 0xff, 0x10, 'b', 'i', 'n', 0x80}
	publish(t, conn, q, publishing{
		MessageId: "m-3", ContentType: "application/octet-stream", Body: body,
		CorrelationId: "corr-9", Headers: amqp.Table{"x-tenant": "acme", "nested": amqp.Table{"a": int32(1)}},
	})
	dlq := rabbitmq.DeadLetterQueue(q)
	testkit.Eventually(t, 10*time.Second, "the DLQ copy", func() bool { return len(readStream(t, conn, dlq)) == 1 })
	time.Sleep(2 * tier)

	if n := len(a.callsFor("m-3")); n != 1 {
		t.Errorf("app called %d times, want 1", n)
	}
	copies := readStream(t, conn, dlq)
	if len(copies) != 1 {
		t.Fatalf("DLQ holds %d copies, want 1", len(copies))
	}
	d := copies[0]
	if !bytes.Equal(d.Body, body) {
		t.Errorf("DLQ body = %x, want byte-identical %x", d.Body, body)
	}
	if d.MessageId != "m-3" || d.ContentType != "application/octet-stream" || d.CorrelationId != "corr-9" {
		t.Errorf("properties not kept: id=%q type=%q corr=%q", d.MessageId, d.ContentType, d.CorrelationId)
	}
	if d.Headers["x-tenant"] != "acme" {
		t.Errorf("original header lost: %v", d.Headers)
	}
	// A stream holds only simple header values: a table is kept as its JSON.
	if nested := d.Headers["nested"]; nested != `{"a":1}` {
		t.Errorf("nested header not kept as its JSON text: %#v", nested)
	}
	want := map[string]string{
		broker.HeaderEventID: "m-3", broker.HeaderAttempt: "1", broker.HeaderDeadReason: "permanent",
		broker.HeaderErrorClass: "permanent", broker.HeaderOrigin: "rabbitmq:" + q,
	}
	for k, v := range want {
		if got := d.Headers[k]; got != v {
			t.Errorf("%s = %v, want %q", k, got, v)
		}
	}
	if e, _ := d.Headers[broker.HeaderError].(string); !strings.Contains(e, "HTTP 422") || !strings.Contains(e, "sku") {
		t.Errorf("%s = %q, want the status and the app's answer", broker.HeaderError, e)
	}
	for _, k := range []string{broker.HeaderFirstAttemptAt, broker.HeaderFirstFailureAt, broker.HeaderDeadline} {
		if v, _ := d.Headers[k].(string); v == "" {
			t.Errorf("%s missing", k)
		} else if _, err := time.Parse(time.RFC3339, v); err != nil {
			t.Errorf("%s = %q: %v", k, v, err)
		}
	}
	if n := depth(t, conn, q); n != 0 {
		t.Errorf("source holds %d, want 0", n)
	}
}

func TestRabbitExhaustionDeadLetters(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, status(http.StatusInternalServerError))
	cfg := testConfig(a.url(), q, tier)
	cfg.Retry.MaxAttempts = 3
	startSidecar(t, cfg)

	publish(t, conn, q, publishing{MessageId: "m-4", Body: []byte("x")})
	dlq := rabbitmq.DeadLetterQueue(q)
	testkit.Eventually(t, 15*time.Second, "the DLQ copy", func() bool { return len(readStream(t, conn, dlq)) == 1 })
	time.Sleep(2 * tier)

	calls := a.callsFor("m-4")
	if len(calls) != 3 {
		t.Fatalf("app called %d times, want exactly max_attempts=3", len(calls))
	}
	for i, c := range calls {
		if got := c.Header.Get("Handoff-Attempt"); got != strconv.Itoa(i+1) {
			t.Errorf("call %d: Handoff-Attempt = %q", i+1, got)
		}
	}
	d := readStream(t, conn, dlq)[0]
	if d.Headers[broker.HeaderDeadReason] != "max-attempts" || d.Headers[broker.HeaderAttempt] != "3" {
		t.Errorf("DLQ copy reason=%v attempt=%v, want max-attempts, 3", d.Headers[broker.HeaderDeadReason], d.Headers[broker.HeaderAttempt])
	}
	if d.Headers[broker.HeaderErrorClass] != "retry" {
		t.Errorf("error class = %v, want retry", d.Headers[broker.HeaderErrorClass])
	}
}

func TestRabbitGoneIsAckedNotDeadLettered(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, status(http.StatusGone))
	s := startSidecar(t, testConfig(a.url(), q, tier))

	publish(t, conn, q, publishing{MessageId: "m-5", Body: []byte("x")})
	testkit.Eventually(t, 10*time.Second, "the call", func() bool { return len(a.callsFor("m-5")) == 1 })
	waitSettled(t, s, 1)
	s.stop(t)
	if n := len(a.callsFor("m-5")); n != 1 {
		t.Errorf("app called %d times, want 1", n)
	}
	for _, name := range []string{q, rabbitmq.RetryQueue(q), rabbitmq.DeadLetterQueue(q)} {
		if n := depth(t, conn, name); n != 0 {
			t.Errorf("%s holds %d, want 0", name, n)
		}
	}
}

func TestRabbitRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier, 2 * time.Second})
	a := newApp(t, func(w http.ResponseWriter, _ call, prior []call) {
		if len(prior) == 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	startSidecar(t, testConfig(a.url(), q, tier, 2*time.Second))

	publish(t, conn, q, publishing{MessageId: "m-6", Body: []byte("x")})
	testkit.Eventually(t, 10*time.Second, "two calls", func() bool { return len(a.callsFor("m-6")) == 2 })
	calls := a.callsFor("m-6")
	if gap := calls[1].At.Sub(calls[0].At); gap < time.Second {
		t.Errorf("second call %v after a 429 with Retry-After: 1, want >= 1s", gap)
	}
}

func TestRabbitDeadlineDeadLetters(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, status(http.StatusInternalServerError))
	cfg := testConfig(a.url(), q, tier)
	cfg.Retry.MaxAttempts = 100
	cfg.Retry.Deadline = config.Duration(1500 * time.Millisecond)
	startSidecar(t, cfg)

	publish(t, conn, q, publishing{MessageId: "m-7", Body: []byte("x")})
	dlq := rabbitmq.DeadLetterQueue(q)
	testkit.Eventually(t, 15*time.Second, "the DLQ copy", func() bool { return len(readStream(t, conn, dlq)) == 1 })
	d := readStream(t, conn, dlq)[0]
	if d.Headers[broker.HeaderDeadReason] != "deadline" {
		t.Errorf("reason = %v, want deadline", d.Headers[broker.HeaderDeadReason])
	}
	calls := a.callsFor("m-7")
	if len(calls) < 2 || len(calls) > 5 {
		t.Errorf("app called %d times in a 1.5s deadline with %v tiers, want 2-5", len(calls), tier)
	}
	// Each call carries the deadline it was made under, by the sidecar's
	// clock. The last reaches the app before it, give or take the time a
	// loaded machine takes to pass a request on (2s here, far more than it
	// needs). A sidecar that ignored the deadline would go on calling
	// every tier, past the slack and past the count above, until its 100
	// attempts.
	last := calls[len(calls)-1]
	deadline, err := time.Parse(broker.TimeLayout, last.Header.Get("Handoff-Deadline"))
	if err != nil {
		t.Fatalf("Handoff-Deadline %q: %v", last.Header.Get("Handoff-Deadline"), err)
	}
	if late := last.At.Sub(deadline); late > 2*time.Second {
		t.Errorf("an attempt reached the app %v past its deadline", late)
	}
}

func TestRabbitForgedHeadersIgnored(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, func(w http.ResponseWriter, c call, _ []call) {
		if c.Header.Get("Ce-Id") == "m-8b" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	startSidecar(t, testConfig(a.url(), q, tier))

	forged := amqp.Table{
		broker.HeaderEventID: "forged-id", broker.HeaderAttempt: "7", "Handoff-Defers": "7",
		broker.HeaderDeadline: "2000-01-01T00:00:00.000Z", broker.HeaderFirstAttemptAt: "2000-01-01T00:00:00.000Z",
		broker.HeaderNextDue: "2100-01-01T00:00:00.000Z", broker.HeaderDeadReason: "permanent",
	}
	publish(t, conn, q,
		publishing{MessageId: "m-8a", Body: []byte("x"), Headers: forged},
		publishing{MessageId: "m-8b", Body: []byte("y"), Headers: forged},
	)
	dlq := rabbitmq.DeadLetterQueue(q)
	testkit.Eventually(t, 10*time.Second, "both messages", func() bool {
		return len(a.callsFor("m-8a")) == 1 && len(readStream(t, conn, dlq)) == 1
	})
	c := a.callsFor("m-8a")[0]
	if got := c.Header.Get("Handoff-Attempt"); got != "1" {
		t.Errorf("Handoff-Attempt = %q, want 1: a producer's handoff-attempt must be ignored", got)
	}
	if dl, _ := time.Parse(time.RFC3339, c.Header.Get("Handoff-Deadline")); dl.Before(time.Now()) {
		t.Errorf("Handoff-Deadline = %q: the producer's deadline was taken", c.Header.Get("Handoff-Deadline"))
	}
	for k := range c.Header {
		if strings.HasPrefix(strings.ToLower(k), "handoff-") && k != "Handoff-Attempt" && k != "Handoff-Deadline" && k != "Handoff-Redelivered" {
			t.Errorf("forged header %s reached the app", k)
		}
	}
	d := readStream(t, conn, dlq)[0]
	if d.Headers[broker.HeaderEventID] != "m-8b" || d.Headers[broker.HeaderAttempt] != "1" {
		t.Errorf("DLQ copy event=%v attempt=%v, want m-8b, 1", d.Headers[broker.HeaderEventID], d.Headers[broker.HeaderAttempt])
	}
	if v, _ := d.Headers[broker.HeaderFirstAttemptAt].(string); strings.HasPrefix(v, "2000") {
		t.Errorf("first-attempt-at %s came from the producer", v)
	}
	if _, ok := d.Headers["Handoff-Defers"]; ok {
		t.Error("forged Handoff-Defers header kept on the copy")
	}
}

func TestRabbitAppDownBurnsNoAttempts(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	// Reserve a port, then leave nothing listening on it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	a := &app{t: t, addr: addr, respond: status(http.StatusOK)}
	t.Cleanup(a.stop)
	s := startSidecar(t, testConfig(a.url(), q, tier))

	var msgs []publishing
	for i := range 5 {
		msgs = append(msgs, publishing{MessageId: fmt.Sprintf("m-9-%d", i), Body: []byte("x")})
	}
	publish(t, conn, q, msgs...)
	testkit.Eventually(t, 20*time.Second, "the sidecar to find nobody home", func() bool {
		_, readyz := healthBodies(t, s.health)
		return strings.Contains(readyz, "app unreachable")
	})
	for _, name := range []string{rabbitmq.RetryQueue(q), rabbitmq.DeadLetterQueue(q)} {
		if n := depth(t, conn, name); n != 0 {
			t.Errorf("%s holds %d while the app is down, want 0", name, n)
		}
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("re-listen on %s: %v", addr, err)
	}
	a.serve(ln)
	testkit.Eventually(t, 15*time.Second, "every message once the app is up", func() bool { return len(a.allCalls()) >= 5 })
	time.Sleep(2 * tier)
	for i := range 5 {
		calls := a.callsFor(fmt.Sprintf("m-9-%d", i))
		if len(calls) != 1 || calls[0].Header.Get("Handoff-Attempt") != "1" {
			t.Errorf("message %d: %d calls, attempt %q; want one call with attempt 1", i, len(calls), calls[0].Header.Get("Handoff-Attempt"))
		}
	}
}
