package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/sidecar"
	"handoff.dev/handoff/internal/testkit"
)

// readyz returns /readyz's status and body.
func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("readyz: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// A stop says "not ready" first: while a call is still in flight and being
// drained, /readyz already answers 503, so nothing new is routed to a
// sidecar that is going away. The call then finishes and is acked.
func TestStopSaysNotReadyFirst(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{time.Second})
	inCall := make(chan struct{})
	release := make(chan struct{})
	a := newApp(t, func(w http.ResponseWriter, _ call, _ []call) {
		close(inCall)
		<-release
		w.WriteHeader(http.StatusOK)
	})
	s := startSidecar(t, testConfig(a.url(), q, time.Second))
	publish(t, conn, q, publishing{MessageId: "slow-1", Body: []byte("x")})
	select {
	case <-inCall:
	case <-time.After(10 * time.Second):
		t.Fatal("the app was not called")
	}
	halted := make(chan error, 1)
	go func() { halted <- s.halt() }()
	testkit.Eventually(t, 5*time.Second, "/readyz to say not ready", func() bool {
		code, body := readyz(t, s.health)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "shutting down")
	})
	select {
	case err := <-halted:
		t.Fatalf("the sidecar stopped (%v) with a call still in flight", err)
	default:
	}
	close(release)
	select {
	case err := <-halted:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the sidecar did not stop after the call finished")
	}
	if n := depth(t, conn, q); n != 0 {
		t.Errorf("%d messages left in %s: the drained call was not acked", n, q)
	}
	if n := depth(t, conn, rabbitmq.RetryQueue(q)); n != 0 {
		t.Errorf("%d messages in the retry queue, want none", n)
	}
}

// The parts of the sidecar run in one group: when one fails, the rest stop
// — intake, the drain, the broker connections, the health server — and serve
// returns that failure, naming the part.
func TestAFailingPartStopsTheSidecar(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{time.Second})
	a := newApp(t, status(http.StatusOK))
	fail := make(chan struct{})
	boom := errors.New("boom")
	s := startSidecarWith(t, testConfig(a.url(), q, time.Second), sidecar.Options{Part: func(ctx context.Context) error {
		select {
		case <-fail:
			return boom
		case <-ctx.Done():
			return nil
		}
	}})
	publish(t, conn, q, publishing{MessageId: "before-1", Body: []byte("x")})
	testkit.Eventually(t, 10*time.Second, "the message handled", func() bool { return len(a.callsFor("before-1")) == 1 })
	close(fail)
	var err error
	select {
	case err = <-s.done:
		s.cancel() // stopped by itself; nothing to halt at cleanup
		s.cancel = nil
	case <-time.After(30 * time.Second):
		t.Fatal("the sidecar went on running after one of its parts failed")
	}
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "test part") {
		t.Fatalf("serve returned %v, want the failed part's error, naming it", err)
	}
	if _, err := http.Get("http://" + s.health + "/healthz"); err == nil {
		t.Error("the health server still answers after serve returned")
	}
	// Intake stopped with the rest: no one consumes the queue any more. The
	// connection is closed by the time serve returns; the queue's count of
	// consumers follows a moment later, as the broker's queue process hears
	// of it, so it is waited for.
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	for _, name := range []string{q, rabbitmq.RetryQueue(q)} {
		testkit.Eventually(t, 10*time.Second, name+" without consumers after serve returned", func() bool {
			st, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			return st.Consumers == 0
		})
	}
}
