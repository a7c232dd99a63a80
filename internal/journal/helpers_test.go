package journal

import (
	"context"
	"log/slog"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/testkit"
)

// t0 is the start of every fake clock: far from the epoch so that negative
// offsets stay valid Unix nanoseconds.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeClock is an Options.Now that only moves when told to. It is safe for
// concurrent use: the compactor goroutine reads it too.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testOptions fills what every test wants: a silent logger and a compactor
// that does not wake up on its own during the test.
func testOptions(o Options) Options {
	if o.Logger == nil {
		o.Logger = discardLogger()
	}
	if o.CompactEvery == 0 {
		o.CompactEvery = time.Hour
	}
	return o
}

// newPath returns a journal path in a fresh temporary directory and, when the
// test ends (after every journal opened with openJournal is closed), checks
// that the file is a consistent bbolt database.
func newPath(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal.db")
	t.Cleanup(func() { testkit.BoltConsistent(t, path, nil) })
	return path
}

// openJournal opens path and closes the journal when the test ends.
func openJournal(t testing.TB, path string, o Options) (*Journal, Recovery) {
	t.Helper()
	j, rec, err := Open(path, testOptions(o))
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := j.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return j, rec
}

// reopen closes j and opens its file again with o.
func reopen(t testing.TB, j *Journal, o Options) (*Journal, Recovery) {
	t.Helper()
	if err := j.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return openJournal(t, j.Path(), o)
}

func appendOK(t testing.TB, j *Journal, k Key, recs ...Record) {
	t.Helper()
	if err := j.Append(context.Background(), k, recs...); err != nil {
		t.Fatalf("Append(%s, %d records): %v", k, len(recs), err)
	}
}

func timeline(t testing.TB, j *Journal, k Key) []Step {
	t.Helper()
	steps, err := j.Timeline(k)
	if err != nil {
		t.Fatalf("Timeline(%s): %v", k, err)
	}
	return steps
}

// equalRecord compares records as the journal promises to keep them: the
// same instant (not the same location or monotonic reading) and every other
// field exactly.
func equalRecord(a, b Record) bool {
	if !a.At.Equal(b.At) {
		return false
	}
	a.At, b.At = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

// at is the fake clock's start plus d, for records with an explicit time.
func at(d time.Duration) time.Time { return t0.Add(d) }

// Outcomes as the journal stores them: budget.Outcome's numbers.
const (
	outSuccess = uint8(budget.Success)
	outRetry   = uint8(budget.Retry)
	outDrop    = uint8(budget.Drop)
)

// Stories of a hand-off, one per phase it can stop in. Times are offsets
// from base so that a story can be placed anywhere on the clock.
func storyReceived(base time.Time) []Record {
	return []Record{{Kind: Received, At: base}}
}

func storyInCall(base time.Time) []Record {
	return append(storyReceived(base), Record{Kind: Attempt, At: base.Add(time.Millisecond), Attempt: 1})
}

func storyHandled(base time.Time) []Record {
	return append(storyInCall(base), Record{Kind: Outcome, At: base.Add(2 * time.Millisecond), Attempt: 1, Outcome: outSuccess, Status: 200, Latency: time.Millisecond})
}

func storyFailed(base time.Time) []Record {
	return append(storyInCall(base), Record{Kind: Outcome, At: base.Add(2 * time.Millisecond), Attempt: 1, Outcome: outRetry, Status: 503, Latency: time.Millisecond, Detail: "http 503"})
}

func storyTransferring(base time.Time) []Record {
	return append(storyFailed(base), Record{Kind: Transferring, At: base.Add(3 * time.Millisecond), Hop: 1, Attempt: 1, Dest: "retry.1s",
		Trail: map[string]string{"handoff-hops": "1", "handoff-first-attempt": base.Format(time.RFC3339Nano)}})
}

func storyTransferred(base time.Time) []Record {
	return append(storyTransferring(base), Record{Kind: Transferred, At: base.Add(4 * time.Millisecond), Hop: 1})
}

func storySettledCopy(base time.Time) []Record {
	return append(storyTransferred(base), Record{Kind: Settled, At: base.Add(5 * time.Millisecond), Hop: 0, Detail: "copied"})
}

func storySettledSuccess(base time.Time) []Record {
	return append(storyHandled(base), Record{Kind: Settled, At: base.Add(3 * time.Millisecond), Hop: 0, Detail: "handled"})
}

// updateFile runs fn in a write transaction on the bbolt file at path, with
// no journal open on it: tests use it to write what the journal would not.
func updateFile(t testing.TB, path string, fn func(*bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		_ = db.Close()
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// damage overwrites the value at key k of b with v, its last byte flipped,
// so that the record fails its checksum.
func damage(b *bolt.Bucket, k, v []byte) error {
	bad := append([]byte(nil), v...)
	bad[len(bad)-1] ^= 0xff
	return b.Put(append([]byte(nil), k...), bad)
}

// stalledCommit opens a journal with o and holds its writer inside a
// commit of a record of its own, so that what is queued meanwhile waits as
// it would behind a commit the disk holds up. resume lets the commit end and
// waits for it.
func stalledCommit(t testing.TB, o Options) (j *Journal, resume func()) {
	t.Helper()
	var block atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	o.BeforeCommit = func(int) error {
		if block.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return nil
	}
	j, _ = openJournal(t, newPath(t), o)
	block.Store(true)
	first := make(chan error, 1)
	go func() {
		first <- j.Append(context.Background(), Key{Source: "s", EventID: "first"}, Record{Kind: Received})
	}()
	<-entered
	var once sync.Once
	resume = func() {
		once.Do(func() {
			close(release)
			if err := <-first; err != nil {
				t.Errorf("the stalled commit: %v", err)
			}
		})
	}
	t.Cleanup(resume) // before the journal closes: cleanups run last first
	return j, resume
}
