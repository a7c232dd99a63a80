package journal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/testkit"
)

func TestParseSyncMode(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		want   SyncMode
		wantOK bool
	}{
		{name: "default", in: "", want: SyncBatch, wantOK: true},
		{name: "batch", in: "batch", want: SyncBatch, wantOK: true},
		{name: "always", in: "always", want: SyncAlways, wantOK: true},
		{name: "none", in: "none", want: SyncNone, wantOK: true},
		{name: "case matters", in: "Always", wantOK: false},
		{name: "unknown", in: "fsync", wantOK: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseSyncMode(tt.in)
			if ok != tt.wantOK || (ok && got != tt.want) {
				t.Fatalf("ParseSyncMode(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
			}
			if ok && tt.in != "" && got.String() != tt.in {
				t.Errorf("%v.String() = %q, want %q", got, got.String(), tt.in)
			}
		})
	}
}

// TestDurability has many goroutines append concurrently, closes, reopens
// and finds every record, in each goroutine's order.
func TestDurability(t *testing.T) {
	tests := []struct {
		name       string
		sync       SyncMode
		goroutines int
		appends    int
	}{
		{name: "batch", sync: SyncBatch, goroutines: 64, appends: 200},
		{name: "always", sync: SyncAlways, goroutines: 16, appends: 25},
		{name: "none", sync: SyncNone, goroutines: 64, appends: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := newPath(t)
			j, _ := openJournal(t, path, Options{Sync: tt.sync})
			keyOf := func(g int) Key { return Key{Source: "durability", EventID: fmt.Sprint(g)} }
			var wg sync.WaitGroup
			errs := make(chan error, tt.goroutines)
			for g := range tt.goroutines {
				wg.Go(func() {
					k := keyOf(g)
					for i := range tt.appends {
						r := Record{Kind: Attempt, Attempt: i + 1}
						if i == 0 {
							r = Record{Kind: Received}
						}
						if err := j.Append(context.Background(), k, r); err != nil {
							errs <- fmt.Errorf("goroutine %d append %d: %w", g, i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			j, rec := reopen(t, j, Options{Sync: tt.sync})
			if rec.Open != tt.goroutines || rec.InCall != tt.goroutines {
				t.Errorf("Recovery = %+v, want %d open, all in a call", rec, tt.goroutines)
			}
			for g := range tt.goroutines {
				steps := timeline(t, j, keyOf(g))
				if len(steps) != tt.appends {
					t.Errorf("%s: %d records, want %d", keyOf(g), len(steps), tt.appends)
					continue
				}
				for i, s := range steps {
					if i > 0 && (s.Kind != Attempt || s.Attempt != i+1 || s.Seq <= steps[i-1].Seq) {
						t.Errorf("%s: step %d = %v attempt %d seq %d, want attempt %d after seq %d", keyOf(g), i, s.Kind, s.Attempt, s.Seq, i+1, steps[i-1].Seq)
						break
					}
				}
			}
		})
	}
}

func TestAppendAsyncIsFlushedByClose(t *testing.T) {
	tests := []struct {
		name string
		sync SyncMode
	}{
		{name: "batch", sync: SyncBatch},
		{name: "always", sync: SyncAlways},
		{name: "none", sync: SyncNone},
	}
	const keys, perKey = 50, 40
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, _ := openJournal(t, newPath(t), Options{Sync: tt.sync, MaxBatch: 64})
			for i := range perKey {
				for k := range keys {
					j.AppendAsync(Key{Source: "async", EventID: fmt.Sprint(k)}, Record{Kind: Attempt, Attempt: i + 1})
				}
			}
			j, _ = reopen(t, j, Options{Sync: tt.sync})
			for k := range keys {
				key := Key{Source: "async", EventID: fmt.Sprint(k)}
				steps := timeline(t, j, key)
				if len(steps) != perKey {
					t.Errorf("%s: %d records after Close, want %d", key, len(steps), perKey)
					continue
				}
				for i, s := range steps {
					if s.Attempt != i+1 {
						t.Errorf("%s: record %d is attempt %d, want %d", key, i, s.Attempt, i+1)
						break
					}
				}
			}
		})
	}
}

func TestClose(t *testing.T) {
	j, _ := openJournal(t, newPath(t), Options{})
	k := Key{Source: "s", EventID: "e"}
	appendOK(t, j, k, Record{Kind: Received})
	if err := j.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := j.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := j.Append(context.Background(), k, Record{Kind: Attempt, Attempt: 1}); !errors.Is(err, ErrClosed) {
		t.Errorf("Append after Close = %v, want ErrClosed", err)
	}
	j.AppendAsync(k, Record{Kind: Attempt, Attempt: 1}) // must neither panic nor block
	if _, err := j.Compact(); err == nil {
		t.Errorf("Compact after Close succeeded")
	}
}

// TestCloseWhileAppending closes the journal while goroutines append: each
// Append either succeeds, and its record is in the file, or fails with
// ErrClosed; none hangs and none panics.
func TestCloseWhileAppending(t *testing.T) {
	path := newPath(t)
	j, _ := openJournal(t, path, Options{})
	const goroutines = 32
	var ok [goroutines]atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			k := Key{Source: "closing", EventID: fmt.Sprint(g)}
			for i := 0; ; i++ {
				err := j.Append(context.Background(), k, Record{Kind: Attempt, Attempt: i + 1})
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("goroutine %d: Append: %v", g, err)
					return
				}
				ok[g].Add(1)
			}
		})
	}
	// Close while every goroutine is appending: each has had one Append
	// through, so the close cuts into a stream, not into nothing.
	testkit.Eventually(t, 10*time.Second, "the condition", func() bool {
		for g := range goroutines {
			if ok[g].Load() == 0 {
				return false
			}
		}
		return true
	})
	if err := j.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()
	j, _ = openJournal(t, path, Options{})
	for g := range goroutines {
		k := Key{Source: "closing", EventID: fmt.Sprint(g)}
		if got, want := len(timeline(t, j, k)), int(ok[g].Load()); got != want {
			t.Errorf("%s: %d records in the file, %d Appends succeeded", k, got, want)
		}
	}
}

// TestAppendContext checks that cancelling stops the wait, not the write.
func TestAppendContext(t *testing.T) {
	release := make(chan struct{})
	var block atomic.Bool
	j, _ := openJournal(t, newPath(t), Options{BeforeCommit: func(int) error {
		if block.Load() {
			<-release
		}
		return nil
	}})
	k := Key{Source: "s", EventID: "e"}
	block.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := j.Append(ctx, k, Record{Kind: Received}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Append with a stuck writer = %v, want context.DeadlineExceeded", err)
	}
	block.Store(false)
	close(release)
	appendOK(t, j, k, Record{Kind: Attempt, Attempt: 1})
	// The cancelled Append was queued: it is written all the same.
	if steps := timeline(t, j, k); len(steps) != 2 {
		t.Errorf("Timeline has %d steps, want 2 (the cancelled Append's record too)", len(steps))
	}
}

// TestGroupCommit counts transactions: concurrent Appends share them with
// SyncBatch and SyncNone, and each has its own with SyncAlways.
func TestGroupCommit(t *testing.T) {
	const n = 256
	tests := []struct {
		name string
		sync SyncMode
		// check judges the transaction count.
		check func(txs int) bool
		want  string
	}{
		// The first commit waits until the others are queued: they fit
		// one more transaction.
		{name: "batch", sync: SyncBatch, check: func(txs int) bool { return txs <= 2 }, want: "2"},
		{name: "none", sync: SyncNone, check: func(txs int) bool { return txs <= 2 }, want: "2"},
		{name: "always", sync: SyncAlways, check: func(txs int) bool { return txs == n }, want: fmt.Sprint(n)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var txs, records atomic.Int64
			path := newPath(t)
			var j *Journal
			ready := make(chan struct{})
			j, _ = openJournal(t, path, Options{Sync: tt.sync, BeforeCommit: func(m int) error {
				if txs.Add(1) == 1 {
					<-ready
					// Those this batch holds (two records each) and the rest.
					for deadline := time.Now().Add(10 * time.Second); m/2+len(j.reqs) < n; time.Sleep(time.Millisecond) {
						if time.Now().After(deadline) {
							return errors.New("the other Appends were never queued")
						}
					}
				}
				records.Add(int64(m))
				return nil
			}})
			close(ready)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for g := range n {
				wg.Go(func() {
					<-start
					k := Key{Source: "group", EventID: fmt.Sprint(g)}
					if err := j.Append(context.Background(), k, Record{Kind: Received}, Record{Kind: Attempt, Attempt: 1}); err != nil {
						t.Errorf("Append: %v", err)
					}
				})
			}
			close(start)
			wg.Wait()
			t.Logf("%d appends in %d transactions", n, txs.Load())
			if !tt.check(int(txs.Load())) {
				t.Errorf("%d concurrent Appends took %d transactions, want %s", n, txs.Load(), tt.want)
			}
			if records.Load() != 2*n {
				t.Errorf("transactions held %d records, want %d", records.Load(), 2*n)
			}
		})
	}
}

// TestGroupCommitMaxBatch checks that a batch never holds more than
// MaxBatch records, while a single request larger than that still commits.
func TestGroupCommitMaxBatch(t *testing.T) {
	const maxBatch = 16
	var over atomic.Int64
	release := make(chan struct{})
	var first atomic.Bool
	first.Store(true)
	j, _ := openJournal(t, newPath(t), Options{MaxBatch: maxBatch, BeforeCommit: func(n int) error {
		if first.Swap(false) {
			<-release // hold the writer so that the others queue up
			return nil
		}
		if n > maxBatch {
			over.Store(int64(n))
		}
		return nil
	}})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // runs before Close, even when the test fails early
	const queued = 30  // fits the queue (4×MaxBatch requests)
	var wg sync.WaitGroup
	wg.Go(func() { appendOK(t, j, Key{Source: "first"}, Record{Kind: Received}) })
	testkit.Eventually(t, 10*time.Second, "the condition", func() bool { return !first.Load() })
	for g := range queued {
		wg.Go(func() {
			appendOK(t, j, Key{Source: "m", EventID: fmt.Sprint(g)}, Record{Kind: Received}, Record{Kind: Attempt, Attempt: 1})
		})
	}
	testkit.Eventually(t, 10*time.Second, "the condition", func() bool { return len(j.reqs) == queued })
	unblock()
	wg.Wait()
	if n := over.Load(); n != 0 {
		t.Errorf("a batch held %d records, MaxBatch is %d", n, maxBatch)
	}
	big := make([]Record, 3*maxBatch)
	for i := range big {
		big[i] = Record{Kind: Attempt, Attempt: i + 1}
	}
	appendOK(t, j, Key{Source: "big"}, big...)
	if got := len(timeline(t, j, Key{Source: "big"})); got != len(big) {
		t.Errorf("big Append: %d records, want %d", got, len(big))
	}
}

// TestAppendLeavesCallerRecords: the writer stamps a missing At on the
// records it commits. Once AppendAsync has returned, or Append has given up
// on a cancelled context, the caller owns its slice again (and may reuse
// it), so the writer must not write into it.
func TestAppendLeavesCallerRecords(t *testing.T) {
	tests := []struct {
		name string
		// send hands recs to j the way the case describes.
		send func(t *testing.T, j *Journal, release chan struct{}, recs []Record)
	}{
		{name: "AppendAsync", send: func(t *testing.T, j *Journal, release chan struct{}, recs []Record) {
			j.AppendAsync(Key{Source: "async"}, recs...)
			close(release)
		}},
		{name: "Append after its context is cancelled", send: func(t *testing.T, j *Journal, release chan struct{}, recs []Record) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			if err := j.Append(ctx, Key{Source: "cancelled"}, recs...); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Append = %v, want context.DeadlineExceeded", err)
			}
			close(release) // the writer goes on with the caller's slice
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			j, _ := openJournal(t, newPath(t), Options{BeforeCommit: func(int) error { <-release; return nil }})
			recs := []Record{{Kind: Received}, {Kind: Attempt, Attempt: 1}}
			tt.send(t, j, release, recs)
			if err := j.Close(); err != nil { // the writer is done with the records
				t.Fatal(err)
			}
			for i, r := range recs {
				if !r.At.IsZero() {
					t.Errorf("caller's record %d was written to after the call returned: At = %v", i, r.At)
				}
			}
		})
	}
}

// A writer alone never waits out the linger: it is for commits many
// writers share. One Append after another, each returns with its own
// commit, far sooner than a linger of thirty seconds (long, so that no slow
// disk or loaded machine can pass for one).
func TestLingerOnlyUnderLoad(t *testing.T) {
	const linger = 30 * time.Second
	j, _ := openJournal(t, newPath(t), Options{Linger: linger})
	start := time.Now()
	for i := range 5 {
		appendOK(t, j, Key{Source: "orders", EventID: fmt.Sprint("seq-", i)}, Record{Kind: Received})
	}
	if took := time.Since(start); took >= linger {
		t.Fatalf("5 appends one after another took %v: they lingered", took)
	}
}
