package handler

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// The call to the app is HTTP/1.1 over pooled keep-alive connections, made
// on the caller's goroutine: the request's head and body in one write, the
// answer read from the same connection. net/http's transport hands every
// request to a write loop and every answer back from a read loop, two more
// goroutines woken per call, and wraps each in contexts of its own; at the
// sidecar's rate that was half its CPU. fasthttp keeps the connections
// (dialing, the pool, idle expiry) and reads the answer's head; the body is
// read here, only as much of it as the evidence needs.

// answer is what a call read of the app's response.
type answer struct {
	status int
	// outcome and retryAfter are the Handoff-Outcome and Retry-After
	// headers, empty when absent.
	outcome, retryAfter string
	// body is the start of the response body, as much as was asked for.
	body []byte
}

// callState is one call's reusable parts, pooled.
type callState struct {
	header fields
	resp   fasthttp.ResponseHeader
	// out is the request as written.
	out []byte
	// While the call is joined to its context's watch (watch.go): its
	// connection, and its neighbours there.
	conn       net.Conn
	prev, next *callState
}

// maxKeptOut is the largest request buffer a pooled call state keeps: a
// request with a body of up to maxInline and a head of a few KiB.
const maxKeptOut = maxInline + 8<<10

var callStates = sync.Pool{New: func() any { return &callState{header: make(fields, 0, 16)} }}

func getCallState() *callState { return callStates.Get().(*callState) }

func putCallState(c *callState) {
	clear(c.header) // no strings kept alive by a pooled state
	c.header = c.header[:0]
	if cap(c.out) > maxKeptOut {
		c.out = nil // a large body's buffer is not kept for every call after it
	}
	c.resp.Reset()
	callStates.Put(c)
}

// staleAfter is how long a pooled connection may sit idle before it is
// checked for a close by the app (an idle timeout, a restart) before use:
// a request written to a connection the app has closed never reaches it,
// and would fail as if the app had taken it, an attempt spent. An app that
// restarts closes every connection at once, and one idle for tens of
// milliseconds is the common case at a modest rate, so the bound is short;
// at full load connections come back within a few milliseconds and skip
// the look (a syscall and three small allocations).
const staleAfter = 5 * time.Millisecond

// maxInterim bounds the 1xx answers read before the final one.
const maxInterim = 8

// errCancelled is a call's error when its caller gave up on it.
var errCancelled = errors.New("call cancelled")

// post sends one request and reads its answer: of the body, up to keepOK
// bytes of a 2xx answer and up to keepFailed of any other. The call ends by
// timeout, or when ctx is done.
func (h *HTTP) post(ctx context.Context, timeout time.Duration, header fields, body []byte, keepOK, keepFailed int, c *callState) (answer, error) {
	if timeout <= 0 {
		return answer{}, fasthttp.ErrTimeout
	}
	// ctx's own deadline is left to its AfterFunc below, like its
	// cancellation: a call it cuts short ends with ctx done, so the caller
	// can tell its own doing from the app's.
	deadline := time.Now().Add(timeout)
	if err := ctx.Err(); err != nil {
		return answer{}, fmt.Errorf("%w: %w", errCancelled, err)
	}
	// A pooled connection the app closed while it was idle is closed and
	// passed over (it would take the request and never answer).
	cc, err := h.hc.AcquireConn(timeout, false)
	for err == nil {
		if err = cc.Conn().SetDeadline(deadline); err != nil {
			h.hc.CloseConn(cc)
			break
		}
		if last := cc.LastUseTime(); last.IsZero() || time.Since(last) <= staleAfter || !peerClosed(cc.Conn()) {
			break
		}
		h.hc.CloseConn(cc)
		cc, err = h.hc.AcquireConn(timeout, false)
	}
	if err != nil {
		return answer{}, err
	}
	conn := cc.Conn()
	var w *callWatch
	if ctx.Done() != nil {
		// Should ctx end, a deadline in the past breaks off the write or
		// read in progress.
		var ok bool
		if w, ok = h.watch(ctx, c, conn); !ok {
			h.hc.ReleaseConn(cc)
			return answer{}, fmt.Errorf("%w: %w", errCancelled, ctx.Err())
		}
	}
	a, reuse, err := h.exchange(conn, header, body, keepOK, keepFailed, c)
	if w != nil && w.leave(c) {
		// Cancelled: the connection's deadline is spoilt, whatever came of
		// the call.
		reuse = false
		if err != nil {
			err = fmt.Errorf("%w: %w", errCancelled, ctx.Err())
		}
	}
	if reuse {
		h.hc.ReleaseConn(cc)
	} else {
		h.hc.CloseConn(cc)
	}
	return a, err
}

// exchange writes the request and reads the answer on conn. reuse says
// whether the connection is left ready for the next request.
func (h *HTTP) exchange(conn net.Conn, header fields, body []byte, keepOK, keepFailed int, c *callState) (a answer, reuse bool, err error) {
	if err := h.send(conn, header, body, c); err != nil {
		return a, false, err
	}
	br := h.hc.AcquireReader(conn)
	defer h.hc.ReleaseReader(br)
	rh := &c.resp
	for n := 0; ; n++ {
		if err := rh.Read(br); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return a, false, fmt.Errorf("reading the answer: %w", err)
		}
		if s := rh.StatusCode(); s >= 200 || s == http.StatusSwitchingProtocols {
			break
		}
		if n == maxInterim {
			return a, false, errors.New("reading the answer: too many 1xx answers")
		}
	}
	a.status = rh.StatusCode()
	if v := rh.Peek("Handoff-Outcome"); len(v) > 0 {
		a.outcome = string(v)
	}
	if v := rh.Peek("Retry-After"); len(v) > 0 {
		a.retryAfter = string(v)
	}
	keep := keepFailed
	if a.status/100 == 2 {
		keep = keepOK
	}
	reuse = rh.IsHTTP11() && !rh.ConnectionClose() && a.status != http.StatusSwitchingProtocols
	if a.status < 200 || a.status == http.StatusNoContent || a.status == http.StatusNotModified {
		return a, reuse, nil
	}
	// The answer's body: what is kept is read, the rest drained so the
	// connection can be reused, unless it is longer than that is worth. A
	// body cut short leaves the status standing: it is the app's answer.
	switch n := rh.ContentLength(); {
	case n >= 0:
		a.body, _ = readUpTo(br, min(n, keep))
		rest := n - len(a.body)
		if rest > drainLimit || (len(a.body) < min(n, keep)) {
			return a, false, nil
		}
		if d, _ := br.Discard(rest); d < rest {
			return a, false, nil
		}
		return a, reuse, nil
	case n == -1: // chunked
		cr := httputil.NewChunkedReader(br)
		a.body, _ = readUpTo(cr, keep)
		if m, err := io.CopyN(io.Discard, cr, drainLimit+1); m > drainLimit || !errors.Is(err, io.EOF) {
			return a, false, nil
		}
		return a, reuse && readTrailer(br), nil
	default: // to the end of the connection
		a.body, _ = readUpTo(br, keep)
		return a, false, nil
	}
}

// readUpTo reads up to n bytes of r, fewer if it ends first; a buffer for
// more than a page grows as the bytes come.
func readUpTo(r io.Reader, n int) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	if n > 4096 {
		return io.ReadAll(io.LimitReader(r, int64(n)))
	}
	b := make([]byte, n)
	m, err := io.ReadFull(r, b)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil
	}
	return b[:m], err
}

// readTrailer reads a chunked body's trailer to its blank line, and reports
// whether it was whole.
func readTrailer(br *bufio.Reader) bool {
	for range 64 {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return false
		}
		if len(line) <= 2 && (len(line) == 1 || line[0] == '\r') {
			return true
		}
	}
	return false
}

// maxInline is the largest body sent in one write with its request's head:
// a larger one follows the head in a write of its own rather than be copied
// into a buffer the pooled call state would keep (or make anew each call).
const maxInline = 16 << 10

// send writes the request: its head and body in one write (one turn with
// the answer's wait, on an answerConn), a larger body after its head.
func (h *HTTP) send(conn net.Conn, header fields, body []byte, c *callState) error {
	inline := len(body) <= maxInline
	var err error
	c.out, err = h.appendHead(c.out[:0], header, len(body))
	if err != nil {
		return err
	}
	if !inline {
		if _, err := conn.Write(c.out); err != nil {
			return err
		}
		_, err := conn.Write(body)
		return err
	}
	c.out = append(c.out, body...)
	if ac, ok := conn.(*answerConn); ok {
		return ac.send(c.out)
	}
	_, err = conn.Write(c.out)
	return err
}

// appendHead appends the request's head to dst: the request line and Host,
// made once, Content-Length, the header and basic auth from the URL unless
// the header has an Authorization of its own.
func (h *HTTP) appendHead(dst []byte, header fields, contentLength int) ([]byte, error) {
	dst = append(dst, h.head...)
	dst = append(dst, "Content-Length: "...)
	dst = strconv.AppendInt(dst, int64(contentLength), 10)
	dst = append(dst, "\r\n"...)
	for _, f := range header {
		if !validName(f.name) {
			return dst, fmt.Errorf("invalid header field name %q", f.name)
		}
		if !validValue(f.value) {
			return dst, fmt.Errorf("invalid header field value for %q", f.name)
		}
		dst = append(dst, f.name...)
		dst = append(dst, ": "...)
		dst = append(dst, f.value...)
		dst = append(dst, "\r\n"...)
	}
	if h.auth != "" && header.find("Authorization") < 0 {
		dst = append(dst, "Authorization: "...)
		dst = append(dst, h.auth...)
		dst = append(dst, "\r\n"...)
	}
	return append(dst, "\r\n"...), nil
}
