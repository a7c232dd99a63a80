package journal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"handoff.dev/handoff/internal/testkit"
)

var errBoom = errors.New("boom: disk on fire")

// TestCommitFailure makes one batch's transaction fail: its Appends fail,
// its records are not in the file, and the journal accepts nothing more.
func TestCommitFailure(t *testing.T) {
	const inBatch = 20
	path := newPath(t)
	var tx atomic.Int64
	var failedRecords atomic.Int64
	var j *Journal // the hook needs it; set before the first Append
	hook := func(n int) error {
		switch tx.Add(1) {
		case 1: // "before": commits
		case 2: // "blocker": holds the writer until the batch has queued
			if !testkit.Wait(10*time.Second, func() bool { return len(j.reqs) >= inBatch }) {
				return errors.New("the batch never queued")
			}
		case 3: // the batch: fails
			failedRecords.Store(int64(n))
			return errBoom
		}
		return nil
	}
	j, _ = openJournal(t, path, Options{BeforeCommit: hook})
	before, blocker := Key{Source: "ok", EventID: "before"}, Key{Source: "ok", EventID: "blocker"}
	appendOK(t, j, before, storyHandled(at(0))...)
	var wg sync.WaitGroup
	wg.Go(func() { appendOK(t, j, blocker, storyReceived(at(0))...) })
	testkit.Eventually(t, 10*time.Second, "the condition", func() bool { return tx.Load() >= 2 })
	errs := make([]error, inBatch)
	for i := range inBatch {
		wg.Go(func() {
			errs[i] = j.Append(context.Background(), Key{Source: "lost", EventID: fmt.Sprint(i)}, storyInCall(at(0))...)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, errBoom) {
			t.Errorf("Append %d of the failed batch = %v, want an error wrapping %v", i, err, errBoom)
		}
	}
	if got := failedRecords.Load(); got != 2*inBatch {
		t.Errorf("the failed transaction held %d records, want %d (one batch)", got, 2*inBatch)
	}
	// The journal stops accepting: later Appends fail without a transaction.
	txsAtFailure := tx.Load()
	if err := j.Append(context.Background(), Key{Source: "later"}, Record{Kind: Received}); !errors.Is(err, errBoom) {
		t.Errorf("Append after the failure = %v, want an error wrapping %v", err, errBoom)
	}
	j.AppendAsync(Key{Source: "later-async"}, Record{Kind: Received})
	j, rec := reopen(t, j, Options{})
	if got := tx.Load(); got != txsAtFailure {
		t.Errorf("%d transactions after the failure, want none", got-txsAtFailure)
	}
	if rec.Open != 2 || rec.Handled != 1 || rec.Received != 1 {
		t.Errorf("Recovery = %+v, want before (handled) and blocker (received) open", rec)
	}
	for _, k := range []Key{before, blocker} {
		if len(timeline(t, j, k)) == 0 {
			t.Errorf("%s: committed before the failure, missing after reopen", k)
		}
	}
	lost := []Key{{Source: "later"}, {Source: "later-async"}}
	for i := range inBatch {
		lost = append(lost, Key{Source: "lost", EventID: fmt.Sprint(i)})
	}
	for _, k := range lost {
		if steps := timeline(t, j, k); len(steps) != 0 {
			t.Errorf("%s: %d records in the file, want none", k, len(steps))
		}
	}
}

// TestCommitFailureQueuedBehind fails a batch while another Append is
// already queued behind it. The journal must not commit that one either:
// once a commit fails nothing after it may be written, or the file could
// hold a hand-off's later records without its earlier ones (an AppendAsync
// RECEIVED lost, the ATTEMPT after it kept: a hand-off that is not open).
func TestCommitFailureQueuedBehind(t *testing.T) {
	path := newPath(t)
	var tx atomic.Int64
	var j *Journal // the hook needs it; set before the first Append
	hook := func(int) error {
		if tx.Add(1) != 1 {
			return nil
		}
		if !testkit.Wait(10*time.Second, func() bool { return len(j.reqs) >= 1 }) {
			return errors.New("nothing queued behind the batch")
		}
		return errBoom
	}
	j, _ = openJournal(t, path, Options{BeforeCommit: hook})
	k := Key{Source: "s", EventID: "e"}
	j.AppendAsync(k, Record{Kind: Received}) // fails in the first transaction
	testkit.Eventually(t, 10*time.Second, "the condition", func() bool { return tx.Load() >= 1 })
	err := j.Append(context.Background(), k, Record{Kind: Attempt, Attempt: 1}) // queued behind it
	if err == nil {
		t.Errorf("Append queued behind a failed commit succeeded, want an error wrapping %v", errBoom)
	}
	j, rec := reopen(t, j, Options{})
	if steps := timeline(t, j, k); len(steps) != 0 {
		t.Errorf("%s: %d records in the file after the failed commit (%v first), want none", k, len(steps), steps[0].Kind)
	}
	t.Logf("Recovery after reopen: %+v", rec)
}

// A commit that fails for want of room (the disk full, a size limit, a
// read-only mount) fails its batch and only it: nothing of it lands, the
// journal says why until a commit succeeds again, and later commits are
// tried. Any other failed commit ends the journal, as before.
func TestNoRoomIsNotTheEnd(t *testing.T) {
	var full atomic.Bool
	type failure struct{ err error }
	var fail atomic.Value // the failure to fail commits with, while full
	j, _ := openJournal(t, newPath(t), Options{BeforeCommit: func(int) error {
		if full.Load() {
			return fail.Load().(failure).err
		}
		return nil
	}})
	ctx := context.Background()
	a, b := Key{Source: "s", EventID: "a"}, Key{Source: "s", EventID: "b"}
	appendOK(t, j, a, Record{Kind: Received})
	if j.NoRoom() != nil {
		t.Fatalf("NoRoom before any failure: %v", j.NoRoom())
	}
	for _, errno := range []error{syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG, syscall.EROFS} {
		full.Store(true)
		fail.Store(failure{&os.PathError{Op: "write", Path: "journal.db", Err: errno}})
		err := j.Append(ctx, b, Record{Kind: Received})
		if !errors.Is(err, ErrNoRoom) || !errors.Is(err, errno) {
			t.Fatalf("%v: Append = %v, want ErrNoRoom wrapping it", errno, err)
		}
		if err := j.NoRoom(); !errors.Is(err, ErrNoRoom) {
			t.Errorf("%v: NoRoom = %v", errno, err)
		}
		if err := j.Probe(ctx); !errors.Is(err, ErrNoRoom) {
			t.Errorf("%v: Probe while full = %v", errno, err)
		}
		full.Store(false)
		if err := j.Probe(ctx); err != nil {
			t.Fatalf("%v: Probe with room again = %v", errno, err)
		}
		if err := j.NoRoom(); err != nil {
			t.Errorf("%v: NoRoom after a commit succeeded = %v", errno, err)
		}
	}
	state := func(t *testing.T, j *Journal, k Key) State {
		t.Helper()
		st, err := j.State(k)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := state(t, j, b); st.Found {
		t.Errorf("records of failed batches landed: %+v", st)
	}
	appendOK(t, j, b, Record{Kind: Received}, Record{Kind: Attempt, Attempt: 1})
	if st := state(t, j, b); st.Attempts != 1 {
		t.Errorf("after room came back: %+v", st)
	}
	if st := state(t, j, a); !st.Found {
		t.Error("a record written before the failures is gone")
	}

	// Another error is the end, as it always was.
	full.Store(true)
	fail.Store(failure{errors.New("bad page")})
	if err := j.Append(ctx, b, Record{Kind: Settled}); err == nil || errors.Is(err, ErrNoRoom) {
		t.Fatalf("Append = %v, want the commit's failure", err)
	}
	full.Store(false)
	if err := j.Append(ctx, b, Record{Kind: Settled}); err == nil {
		t.Error("a journal whose commit failed accepted more")
	}
}
