package handler

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/testkit"
)

// thenRecorder keeps each answer DeliverThen tells, by event id, and on
// which goroutine's turn: inline means before DeliverThen returned.
type thenRecorder struct {
	mu      sync.Mutex
	answers map[string][]Result
	done    sync.WaitGroup
}

type told struct {
	rec *thenRecorder
	id  string
}

func (t told) Answered(res Result) {
	t.rec.mu.Lock()
	t.rec.answers[t.id] = append(t.rec.answers[t.id], res)
	t.rec.mu.Unlock()
	t.rec.done.Done()
}

func (r *thenRecorder) deliver(b *Batcher, ctx context.Context, reqs ...*Request) {
	for _, q := range reqs {
		r.done.Add(1)
		b.DeliverThen(ctx, q, told{r, q.EventID})
	}
}

// A split batch answers each attempt once, through Then, with what Deliver
// would have answered: the poison its own failure, the rest success.
func TestDeliverThenAnswersEachAttemptOnce(t *testing.T) {
	reqs := fresh(8)
	poison := reqs[5].EventID
	app, srv := newPoisonApp(t, holding(http.StatusInternalServerError, poison))
	b := NewBatcher(newClient(t, srv.URL, 8), BatchOptions{MaxMessages: 8, MaxWait: time.Minute, Budget: &tokens{left: 100}})
	defer b.Close()
	rec := &thenRecorder{answers: map[string][]Result{}}
	rec.deliver(b, context.Background(), reqs...)
	rec.done.Wait()
	res := make([]Result, len(reqs))
	for i, q := range reqs {
		got := rec.answers[q.EventID]
		if len(got) != 1 {
			t.Fatalf("%s answered %d times, want once", q.EventID, len(got))
		}
		res[i] = got[0]
	}
	checkPoisoned(t, reqs, res, budget.Retry, poison)
	if n := app.count(); n != 7 {
		t.Errorf("%d requests, want 7 (one batch, split three times)", n)
	}
	for i, r := range res {
		if r.Latency <= 0 {
			t.Errorf("%s: no latency", reqs[i].EventID)
		}
	}
}

// An attempt not taken is answered at once: cancelled before it was sent,
// or given to a closed batcher.
func TestDeliverThenAnswersAnAttemptNotTaken(t *testing.T) {
	_, srv := newPoisonApp(t, holding(0))
	b := NewBatcher(newClient(t, srv.URL, 4), BatchOptions{MaxMessages: 4, MaxWait: time.Millisecond})
	rec := &thenRecorder{answers: map[string][]Result{}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec.deliver(b, ctx, attempt("cancelled", nil, ""))
	b.Close()
	rec.deliver(b, context.Background(), attempt("closed", nil, ""))
	// Both before DeliverThen returned: no wait.
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if got := rec.answers["cancelled"]; len(got) != 1 || got[0].Outcome != budget.Unknown {
		t.Errorf("cancelled before it was sent: %+v, want one unknown answer", got)
	}
	if got := rec.answers["closed"]; len(got) != 1 || got[0].Outcome != budget.Unreachable {
		t.Errorf("given to a closed batcher: %+v, want one unreachable answer", got)
	}
}

// An attempt whose caller's context ends while its batch is in flight is
// answered once the batch's request is cancelled, not left waiting for the
// app.
func TestDeliverThenCancelledInFlight(t *testing.T) {
	got := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a closed connection only after the body
		close(got)
		<-r.Context().Done()
	}))
	defer srv.Close()
	b := NewBatcher(newClient(t, srv.URL, 2), BatchOptions{MaxMessages: 2, MaxWait: time.Millisecond})
	defer b.Close()
	rec := &thenRecorder{answers: map[string][]Result{}}
	ctx, cancel := context.WithCancel(context.Background())
	reqs := fresh(2)
	for _, r := range reqs {
		r.Timeout = time.Hour
	}
	rec.deliver(b, ctx, reqs...)
	<-got
	cancel()
	waited := make(chan struct{})
	go func() { rec.done.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("no answer 10 s after the context ended")
	}
	for _, r := range reqs {
		if got := rec.answers[r.EventID]; len(got) != 1 || got[0].Outcome != budget.Unknown {
			t.Errorf("%s: %+v, want one unknown answer", r.EventID, got)
		}
	}
}

// Batches go out on goroutines kept for the next batch, and Close ends
// them: one batch after another is one goroutine, and none is left.
func TestBatchSendersAreReusedAndEndWithClose(t *testing.T) {
	_, srv := newPoisonApp(t, holding(0))
	b := NewBatcher(newClient(t, srv.URL, 4), BatchOptions{MaxMessages: 2, MaxWait: time.Millisecond})
	for range 5 {
		for _, r := range deliverAll(b, fresh(2)...) {
			if r.Outcome != budget.Success {
				t.Fatalf("%v, want success", r.Outcome)
			}
		}
		// The answers are in before the sender is back waiting: the
		// next batch would start a second one meanwhile.
		testkit.Wait(5*time.Second, func() bool { n, idle := senders(b); return n == idle })
	}
	if n, _ := senders(b); n != 1 {
		t.Errorf("%d senders after five batches one after another, want 1", n)
	}
	b.Close()
	// Close returns once each sender is done; a goroutine may still be on
	// its way out of the function.
	testkit.Wait(5*time.Second, func() bool { n, _ := senders(b); return n == 0 })
	if n, _ := senders(b); n != 0 {
		t.Errorf("%d senders after Close, want none", n)
	}
}

// senders counts the goroutines in b's Batcher.sender, and those of them
// idle (waiting in its select). Other tests' batchers have senders too.
func senders(b *Batcher) (n, idle int) {
	frame := fmt.Sprintf("handler.(*Batcher).sender(%p", b)
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, frame) {
			continue
		}
		n++
		if strings.HasPrefix(g, "goroutine ") && strings.Contains(strings.SplitN(g, "\n", 2)[0], "[select") {
			idle++
		}
	}
	return n, idle
}
