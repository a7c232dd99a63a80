package handler

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// callWatch breaks off the calls in progress under one context when it
// ends, by giving their connections a deadline in the past. It is one
// context.AfterFunc for the context, not one for each call: the engine's
// calls share one context, and an AfterFunc each cost a call three
// allocations and two turns on that context's lock (its set of children),
// a few percent of a message's CPU. Calls join and leave it under its own
// lock, linked through their callState.
type callWatch struct {
	ctx  context.Context
	stop func() bool // the AfterFunc's

	mu    sync.Mutex
	calls *callState // joined, linked by next and prev
	n     int
	// ended: ctx ended, and every call joined then was broken off.
	ended bool
	// retired: no longer its HTTP's watch (another context's is); the
	// last call to leave stops it, and none joins once it is stopped.
	retired, stopped bool
}

// broken is the deadline that breaks off a write or read in progress.
var broken = time.Unix(1, 0)

// watch joins c's call on conn to the watch of ctx: the HTTP's, or a new
// one that becomes the HTTP's. ok is false when ctx has ended: the call is
// not to be made.
func (h *HTTP) watch(ctx context.Context, c *callState, conn net.Conn) (w *callWatch, ok bool) {
	if w = h.watching.Load(); w != nil && w.ctx == ctx {
		switch joined, ended := w.join(c, conn); {
		case joined:
			return w, true
		case ended:
			return nil, false
		}
		// Stopped, replaced and idle: a new one.
	}
	return h.newWatch(ctx, c, conn), true
}

// newWatch makes a watch of ctx with c's call on conn joined from the
// start, so that no one stops it before the call leaves, makes it the
// HTTP's, and retires the one it replaces. Should ctx have ended already,
// the watch breaks the call off at once.
func (h *HTTP) newWatch(ctx context.Context, c *callState, conn net.Conn) *callWatch {
	w := &callWatch{ctx: ctx}
	w.link(c, conn)
	h.watchMu.Lock()
	w.stop = context.AfterFunc(ctx, func() {
		w.breakOff()
		h.watching.CompareAndSwap(w, nil)
	})
	old := h.watching.Swap(w)
	h.watchMu.Unlock()
	if old != nil {
		old.retire()
	}
	return w
}

// join links c, whose call is on conn, into w: joined, or not because ctx
// has ended (ended) or w was stopped (replaced, with no call left).
func (w *callWatch) join(c *callState, conn net.Conn) (joined, ended bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended || w.stopped {
		return false, w.ended
	}
	w.link(c, conn)
	return true, false
}

func (w *callWatch) link(c *callState, conn net.Conn) {
	c.conn, c.prev, c.next = conn, nil, w.calls
	if w.calls != nil {
		w.calls.prev = c
	}
	w.calls = c
	w.n++
}

// leave unlinks c; broken says its call was broken off (its connection's
// deadline is spoilt).
func (w *callWatch) leave(c *callState) (broken bool) {
	w.mu.Lock()
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		w.calls = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	c.conn, c.prev, c.next = nil, nil, nil
	w.n--
	broken = w.ended
	last := w.retired && w.n == 0
	w.stopped = w.stopped || last
	w.mu.Unlock()
	if last {
		w.stop()
	}
	return broken
}

// breakOff is the AfterFunc: every call joined is broken off, and none
// joins after it.
func (w *callWatch) breakOff() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
	for c := w.calls; c != nil; c = c.next {
		_ = c.conn.SetDeadline(broken)
	}
}

// retire stops w once no call is joined: its context's calls join a new
// watch from now on.
func (w *callWatch) retire() {
	w.mu.Lock()
	w.retired = true
	idle := w.n == 0
	w.stopped = w.stopped || idle
	w.mu.Unlock()
	if idle {
		w.stop()
	}
}

// watchingState is the HTTP's part of the watches.
type watchingState struct {
	watchMu  sync.Mutex // orders the making of watches
	watching atomic.Pointer[callWatch]
}
