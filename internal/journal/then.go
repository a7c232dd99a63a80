package journal

import (
	"context"
	"sync"
)

// Then is what AppendThen calls back: an interface, not a func, so that a
// caller whose state is already on the heap passes it without allocating a
// closure.
type Then interface {
	Committed(err error)
}

// ThenFunc is a func as a Then.
type ThenFunc func(error)

// Committed calls f.
func (f ThenFunc) Committed(err error) { f(err) }

// AppendThen queues recs, as AppendAsync does, and calls then with the
// commit's result once they are durable (or could not be written): on a
// goroutine of the journal's own, after the commit, in commit order, one call
// at a time. A caller that would otherwise park until its records are
// durable hands the rest of its work over instead. then may append (it must
// not wait on a commit of its own: the goroutine it runs on is the one that
// answers the next commit's). Should the journal already refuse records,
// then is called at once, on the caller's goroutine.
func (j *Journal) AppendThen(k Key, then Then, recs ...Record) {
	req := newRecords(k, recs, false)
	req.then = then
	if err := j.enqueue(context.Background(), req); err != nil {
		req.free()
		then.Committed(err)
	}
}

// thenCall is an AppendThen callback with its commit's result.
type thenCall struct {
	then Then
	err  error
}

// thens are the callbacks of committed requests, waiting for the settler.
// The queue is unbounded: the writer must never wait on a callback (a
// callback that appends waits on the writer), and it holds no more than the
// requests that were in flight.
type thens struct {
	mu     sync.Mutex
	q      []thenCall
	closed bool
	wake   chan struct{} // one pending wake-up
}

func newThens() *thens { return &thens{wake: make(chan struct{}, 1)} }

func (t *thens) push(calls []thenCall) {
	t.mu.Lock()
	t.q = append(t.q, calls...)
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// close lets the settler return once the queue is empty.
func (t *thens) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// settler runs the callbacks, in the order their commits landed, until the
// writer is gone and none are left.
func (j *Journal) settler() {
	defer j.wg.Done()
	t := j.thens
	var run []thenCall
	for {
		t.mu.Lock()
		run, t.q = t.q, run[:0]
		closed := t.closed
		t.mu.Unlock()
		for i := range run {
			run[i].then.Committed(run[i].err)
			run[i] = thenCall{}
		}
		if len(run) == 0 {
			if closed {
				return
			}
			<-t.wake
		}
	}
}
