package main

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// A timed-out call may have taken effect: the next attempt carries the same
// event id and says so.
func TestRabbitTimeoutRetriesAsRedelivered(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, func(w http.ResponseWriter, _ call, prior []call) {
		if len(prior) == 0 {
			time.Sleep(600 * time.Millisecond) // past handler.timeout
		}
		w.WriteHeader(http.StatusOK)
	})
	cfg := testConfig(a.url(), q, tier)
	cfg.Handler.Timeout = config.Duration(200 * time.Millisecond)
	startSidecar(t, cfg)

	publish(t, conn, q, publishing{MessageId: "m-to", Body: []byte("x")})
	testkit.Eventually(t, 10*time.Second, "the second call", func() bool { return len(a.callsFor("m-to")) == 2 })
	calls := a.callsFor("m-to")
	if got := calls[0].Header.Get("Handoff-Redelivered"); got != "false" {
		t.Errorf("first call Handoff-Redelivered = %q, want false", got)
	}
	if got := calls[1].Header.Get("Handoff-Redelivered"); got != "true" {
		t.Errorf("call after a timeout: Handoff-Redelivered = %q, want true", got)
	}
	if got := calls[1].Header.Get("Handoff-Attempt"); got != "2" {
		t.Errorf("call after a timeout: Handoff-Attempt = %q, want 2", got)
	}
}

// A 409 defers: it is retried, and does not count against max_attempts.
func TestRabbitDeferDoesNotBurnAttempts(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, func(w http.ResponseWriter, _ call, prior []call) {
		switch len(prior) {
		case 0, 1:
			w.WriteHeader(http.StatusConflict)
		case 2:
			w.WriteHeader(http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusOK)
		}
	})
	cfg := testConfig(a.url(), q, tier)
	cfg.Retry.MaxAttempts = 2 // two failures allowed; the two deferrals are not failures
	startSidecar(t, cfg)

	publish(t, conn, q, publishing{MessageId: "m-def", Body: []byte("x")})
	testkit.Eventually(t, 15*time.Second, "four calls", func() bool { return len(a.callsFor("m-def")) == 4 })
	time.Sleep(2 * tier)
	if n := len(a.callsFor("m-def")); n != 4 {
		t.Errorf("app called %d times, want 4 (defer, defer, 500, 200)", n)
	}
	if n := len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))); n != 0 {
		t.Errorf("DLQ holds %d: deferrals were counted as failed attempts", n)
	}
}

// A copy in the retry queue whose handoff-* headers cannot be read is kept,
// in the DLQ with reason malformed, never dropped and never guessed at.
func TestRabbitMalformedRetryCopyDeadLettered(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, status(http.StatusOK))
	startSidecar(t, testConfig(a.url(), q, tier))

	publish(t, conn, rabbitmq.RetryQueue(q), publishing{
		MessageId: "m-bad", Body: []byte("payload"),
		Headers: amqp.Table{broker.HeaderEventID: "m-bad", broker.HeaderAttempt: "two"},
	})
	dlq := rabbitmq.DeadLetterQueue(q)
	testkit.Eventually(t, 10*time.Second, "the DLQ copy", func() bool { return len(readStream(t, conn, dlq)) == 1 })
	d := readStream(t, conn, dlq)[0]
	if d.Headers[broker.HeaderDeadReason] != "malformed" || string(d.Body) != "payload" {
		t.Errorf("DLQ copy reason=%v body=%q, want malformed, payload", d.Headers[broker.HeaderDeadReason], d.Body)
	}
	if e, _ := d.Headers[broker.HeaderError].(string); e == "" {
		t.Error("no evidence of what was malformed")
	}
	if n := len(a.allCalls()); n != 0 {
		t.Errorf("app called %d times for a malformed copy, want 0", n)
	}
}

// A copy that comes back before its due time (it needed more than the
// largest tier) is delayed again, without an attempt.
func TestRabbitEarlyCopyWaitsUntilDue(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, status(http.StatusOK))
	startSidecar(t, testConfig(a.url(), q, tier))

	now := time.Now()
	due := now.Add(1500 * time.Millisecond)
	trail := broker.Trail{
		EventID: "m-early", Attempt: 1, Hops: 1, FirstAttemptAt: now, FirstFailureAt: now,
		NextDue: due, Deadline: now.Add(time.Hour), ErrorClass: "retry", Origin: "rabbitmq:" + q,
	}
	headers := amqp.Table{}
	for k, v := range trail.Headers() {
		headers[k] = v
	}
	publish(t, conn, rabbitmq.RetryQueue(q), publishing{MessageId: "m-early", Body: []byte("x"), Headers: headers})
	testkit.Eventually(t, 10*time.Second, "the call", func() bool { return len(a.callsFor("m-early")) == 1 })
	c := a.callsFor("m-early")[0]
	if c.At.Before(due) {
		t.Errorf("called %v before the copy was due", due.Sub(c.At))
	}
	if got := c.Header.Get("Handoff-Attempt"); got != strconv.Itoa(2) {
		t.Errorf("Handoff-Attempt = %q, want 2: a re-delay is not an attempt", got)
	}
}
