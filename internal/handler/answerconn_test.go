//go:build unix

package handler

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// answerPair is an answerConn dialed to a loopback listener, and the
// listener's end.
func answerPair(t *testing.T) (*answerConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	ac, ok := newAnswerConn(c).(*answerConn)
	if !ok {
		t.Fatal("a TCP connection was not wrapped")
	}
	return ac, s.(*net.TCPConn)
}

// sendTo starts ac.send(req) and checks that the app reads req whole; the
// channel has what send returned.
func sendTo(t *testing.T, ac *answerConn, app net.Conn, req []byte) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- ac.send(req) }()
	got := make([]byte, len(req))
	if _, err := io.ReadFull(app, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, req) {
		t.Fatalf("the app read %d bytes unlike the %d sent", len(got), len(req))
	}
	return done
}

// send returns once the answer has begun to arrive, not when the request is
// written; what arrived is then read as from any connection.
func TestAnswerConnWaitsForTheAnswer(t *testing.T) {
	ac, app := answerPair(t)
	req := []byte("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
	done := sendTo(t, ac, app, req)
	select {
	case err := <-done:
		t.Fatalf("send returned (%v) before the app answered", err)
	default:
	}
	if _, err := app.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := ac.Read(buf)
	if err != nil || string(buf[:n]) != "answer" {
		t.Fatalf("read %q, %v; want the answer", buf[:n], err)
	}
	// The next request on the connection waits for its own answer.
	done = sendTo(t, ac, app, req)
	_, _ = app.Write([]byte("second"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, err = ac.Read(buf); err != nil || string(buf[:n]) != "second" {
		t.Fatalf("read %q, %v; want the second answer", buf[:n], err)
	}
}

// A request larger than the socket takes at once is finished by a plain
// write, whole and in order, and its answer read.
func TestAnswerConnFinishesARequestTheSocketCannotTakeAtOnce(t *testing.T) {
	ac, app := answerPair(t)
	if err := ac.Conn.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	req := make([]byte, 1<<20)
	for i := range req {
		req[i] = byte(i % 251)
	}
	done := sendTo(t, ac, app, req)
	_, _ = app.Write([]byte("ok"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if n, err := io.ReadAtLeast(ac, buf, 2); err != nil || string(buf[:n]) != "ok" {
		t.Fatalf("read %q, %v; want the answer", buf[:n], err)
	}
}

// The wait ends with the connection's deadline, as a read does.
func TestAnswerConnWaitEndsWithTheDeadline(t *testing.T) {
	ac, app := answerPair(t)
	if err := ac.SetDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	err := ac.send([]byte("GET / HTTP/1.1\r\n\r\n"))
	var op *net.OpError
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &op) || op.Op != "read" {
		t.Fatalf("send = %v, want a read's deadline error", err)
	}
	buf := make([]byte, 64)
	if n, err := app.Read(buf); err != nil || n == 0 {
		t.Fatalf("the app read %d bytes, %v: the request was not written", n, err)
	}
}

// An app that closes instead of answering ends the wait; the read finds
// the end of the connection.
func TestAnswerConnWaitEndsWhenTheAppCloses(t *testing.T) {
	ac, app := answerPair(t)
	done := make(chan error, 1)
	go func() { done <- ac.send([]byte("GET / HTTP/1.1\r\n\r\n")) }()
	buf := make([]byte, 64)
	if _, err := app.Read(buf); err != nil {
		t.Fatal(err)
	}
	_ = app.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, err := ac.Read(buf); err != io.EOF {
		t.Fatalf("read %d, %v; want EOF", n, err)
	}
}
