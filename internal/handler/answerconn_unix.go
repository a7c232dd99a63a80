//go:build unix

package handler

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// answerConn is a plain stream connection to the app that writes a request
// and waits for its answer in one turn on the socket. Written and then read
// the usual way, the first read of the answer comes straight after the
// write and finds nothing, the app not having had the time to answer: it
// fails (EAGAIN), the call parks until the poller says the socket is
// readable, and reads again. One read syscall in two was that failed one,
// about half a microsecond a call.
//
// The wait cannot simply go before the first read: Go's poller forgets a
// socket's readiness when a read begins (it is about to be found out), so
// an answer that came in before the wait began would never wake it. Here
// the wait's read begins before the request is written: the write is made
// inside it, so every byte of the answer comes after, and wakes the wait.
type answerConn struct {
	net.Conn
	rc syscall.RawConn
	// The request being sent, for sendFn.
	req     []byte
	sent    int
	werr    error
	written bool
	sendFn  func(fd uintptr) bool
}

// newAnswerConn wraps c, a connection to the app; c itself when it gives
// no access to its socket.
func newAnswerConn(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	a := &answerConn{Conn: c, rc: rc}
	a.sendFn = a.send1 // made once: a method value passed per call would be allocated per call
	return a
}

// SyscallConn is the socket's, made once: peerClosed looks at it.
func (a *answerConn) SyscallConn() (syscall.RawConn, error) { return a.rc, nil }

// send writes req, a whole request, and returns once the socket is readable:
// the answer, or the app closing it, has begun to arrive. A request the
// socket does not take at once (its buffer full) is finished by a plain
// write, and its answer waited for by the reads. The wait ends early with
// the connection's deadline: the call's timeout, or its context's end
// through the watch.
func (a *answerConn) send(req []byte) error {
	a.req, a.sent, a.werr, a.written = req, 0, nil, false
	err := a.rc.Read(a.sendFn)
	sent, werr := a.sent, a.werr
	a.req = nil
	switch {
	case err != nil:
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "raw-read" {
			op.Op = "read" // the answer's wait, as net.Conn's Read says it
		}
		return err
	case werr != nil:
		return &net.OpError{Op: "write", Net: a.LocalAddr().Network(), Source: a.LocalAddr(), Addr: a.RemoteAddr(), Err: os.NewSyscallError("write", werr)}
	case sent < len(req):
		_, err = a.Conn.Write(req[sent:])
		return err
	}
	return nil
}

// send1 is send's turn on the socket: the first call writes the request and
// asks to wait; the next, once the socket is readable, ends the turn.
func (a *answerConn) send1(fd uintptr) bool {
	if a.written {
		return true
	}
	for a.sent < len(a.req) {
		n, err := syscall.Write(int(fd), a.req[a.sent:])
		if n > 0 {
			a.sent += n
		}
		switch err {
		case nil:
			if n <= 0 {
				a.werr = io.ErrShortWrite
				return true
			}
		case syscall.EINTR:
		case syscall.EAGAIN:
			return true // full: the rest by a plain write
		default:
			a.werr = err
			return true
		}
	}
	a.written = true
	return false
}
