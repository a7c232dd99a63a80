package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// rawApp is an app that speaks raw TCP: it reads each request (headers and
// Content-Length bytes of body, or as much of it as answer says) and writes
// whatever answer returns, then closes the connection when answer says so.
// An empty answer that does not close hangs until the caller closes. It
// records the ce-id and Handoff-Redelivered of every request it read the
// headers of.
type rawApp struct {
	ln     net.Listener
	answer func(id string, n int) (reply string, readBody, closeAfter bool)
	mu     sync.Mutex
	calls  map[string][]string // id → Handoff-Redelivered of each call
}

func newRawApp(t *testing.T, answer func(id string, n int) (string, bool, bool)) *rawApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &rawApp{ln: ln, answer: answer, calls: map[string][]string{}}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go a.serve(c)
		}
	}()
	return a
}

func (a *rawApp) url() string { return "http://" + a.ln.Addr().String() + "/events" }

func (a *rawApp) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(r)
		if err != nil {
			return
		}
		id := req.Header.Get("Ce-Id")
		a.mu.Lock()
		a.calls[id] = append(a.calls[id], req.Header.Get("Handoff-Redelivered"))
		n := len(a.calls[id])
		a.mu.Unlock()
		reply, readBody, closeAfter := a.answer(id, n)
		if readBody {
			_, _ = io.Copy(io.Discard, req.Body)
		} else {
			_, _ = io.CopyN(io.Discard, req.Body, 10) // part of it
		}
		if reply != "" {
			_, _ = io.WriteString(c, reply)
		}
		if reply == "" && !closeAfter {
			// Hanging: read until the caller gives up and closes.
			_, _ = io.Copy(io.Discard, r)
			return
		}
		if closeAfter {
			return
		}
	}
}

func (a *rawApp) callsOf(id string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.calls[id]...)
}

const rawOK = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"

// TestAppFaults: an app that hangs, answers garbage, writes half a
// response, or closes the connection in the middle of the request's body.
// Each such call's outcome is unknown — the app may have done the work —
// so the message is tried again, and that call says Handoff-Redelivered:
// true. Every message ends handled; none is lost, none dead-lettered.
func TestAppFaults(t *testing.T) {
	t.Parallel()
	faults := map[string]string{
		// The first call of each id gets the fault; the second a 200.
		"garbage":     "HELLO THERE\r\n\r\n",
		"half-header": "HTTP/1.1 200 OK\r\nContent-Le",
		"no-answer":   "",
	}
	a := newRawApp(t, func(id string, n int) (string, bool, bool) {
		if n > 1 {
			return rawOK, true, false
		}
		switch id {
		case "hang":
			return "", true, false // no answer until the sidecar gives up (below)
		case "mid-body":
			return "", false, true // reads 10 bytes of the body, then closes
		}
		return faults[id], true, true
	})
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	cfg := testConfig(a.url(), q, tier)
	cfg.Handler.Timeout = config.Duration(500 * time.Millisecond)
	startSidecar(t, cfg)
	ids := []string{"hang", "garbage", "half-header", "no-answer", "mid-body"}
	var msgs []publishing
	for _, id := range ids {
		msgs = append(msgs, publishing{MessageId: id, Body: []byte(strings.Repeat("x", 4096))})
	}
	publish(t, conn, q, msgs...)
	testkit.Eventually(t, 30*time.Second, "every message handled on its second call", func() bool {
		for _, id := range ids {
			if len(a.callsOf(id)) < 2 {
				return false
			}
		}
		return depth(t, conn, q) == 0
	})
	for _, id := range ids {
		calls := a.callsOf(id)
		if len(calls) != 2 {
			t.Errorf("%s: %d calls, want the fault and one more", id, len(calls))
			continue
		}
		if calls[0] != "false" || calls[1] != "true" {
			t.Errorf("%s: Handoff-Redelivered %v, want false then true", id, calls)
		}
	}
	if n := len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))); n != 0 {
		t.Errorf("%d dead letters, want none", n)
	}
}

// TestAppFlapping: an app that goes away and comes back, four times, while
// messages flow, each time away until the sidecar has found it gone. A call that cannot connect never reached the app:
// it burns no attempt, and the delivery waits for the app. Every message
// is handled once its app is back, and none is dead-lettered, though the
// app was down longer than max_attempts calls would last.
func TestAppFlapping(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string]int{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("Ce-Id")]++
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	srv := &http.Server{Handler: handler}
	go func() { _ = srv.Serve(ln) }()

	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	cfg := testConfig("http://"+addr+"/events", q, tier)
	cfg.Retry.MaxAttempts = 2
	s := startSidecar(t, cfg)

	const n = 60
	stop := make(chan struct{})
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := range n {
			publish(t, conn, q, publishing{MessageId: fmt.Sprintf("f-%d", i), Body: []byte("x")})
			select {
			case <-stop:
				return
			case <-time.After(30 * time.Millisecond):
			}
		}
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
	// Down and up four times while the messages arrive: up until a few
	// more are handled, down until the sidecar has found the app gone.
	for i := range 4 {
		testkit.Eventually(t, 10*time.Second, "a few messages handled", func() bool { return count() >= 5*(i+1) })
		_ = srv.Close()
		testkit.Eventually(t, 10*time.Second, "the sidecar to find the app unreachable", func() bool {
			_, readyz := healthBodies(t, s.health)
			return strings.Contains(readyz, "app unreachable")
		})
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			close(stop)
			t.Fatalf("the app could not come back on %s: %v", addr, err)
		}
		srv = &http.Server{Handler: handler}
		go func(ln net.Listener, s *http.Server) { _ = s.Serve(ln) }(ln, srv)
	}
	<-published
	t.Cleanup(func() { _ = srv.Close() })
	testkit.Eventually(t, 30*time.Second, "every message handled", func() bool {
		return count() == n && depth(t, conn, q) == 0
	})
	if d := len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))); d != 0 {
		t.Errorf("%d dead letters from an app that was only away, want none", d)
	}
}
