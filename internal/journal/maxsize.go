package journal

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// DefaultMaxSize is Options.MaxSize when it is zero.
const DefaultMaxSize = 256 << 20

// trimTo is the share of MaxSize that trimming brings the live data back
// under: trimming at every commit past the bound would cost a transaction
// for every few hand-offs written.
const trimTo = 0.9

// maxTrimPasses bounds one trim's transactions; the next trim goes on.
const maxTrimPasses = 64

// logEvery bounds how often trimming logs: at most one line of each kind a
// minute, however often it runs.
const logEvery = time.Minute

// trimState is what trimming keeps between runs. Its fields other than
// stuck belong to the one trim that runs at a time (mu).
type trimState struct {
	mu sync.Mutex // one trim at a time: the compactor's, or a caller's
	// stuck is set while what is left after dropping every settled
	// hand-off is still over the bound: the writer stops asking for a trim
	// that would find nothing, and the compactor's tick tries again.
	stuck atomic.Bool

	dropped    int       // dropped since the last Warn
	oldestKept time.Time // the oldest settle time kept, after the latest trim
	warnedAt   time.Time
	erroredAt  time.Time
}

// inUse is the size of the journal's live data: the pages up to the high
// water mark less those on the freelist (free, or freed and waiting for
// readers to finish). bbolt allocates from the freelist before it grows the
// file, so the file's size follows the live data's high water mark.
func (j *Journal) inUse() int64 {
	var size int64
	if err := j.db.View(func(tx *bolt.Tx) error {
		size = tx.Size()
		return nil
	}); err != nil {
		return 0
	}
	return size - j.freeBytes()
}

// freeBytes is the freelist's pages as of the latest write transaction.
func (j *Journal) freeBytes() int64 {
	st := j.db.Stats()
	return int64(st.FreePageN+st.PendingPageN) * j.pageSize
}

// overSize reports, after a commit, whether the live data reached MaxSize
// and a trim may help.
func (j *Journal) overSize() bool {
	return j.o.MaxSize > 0 && !j.trim.stuck.Load() && j.inUse() >= j.o.MaxSize
}

// TrimToSize drops settled hand-offs, the earliest settled first, when the
// journal's live data has reached MaxSize, until it is under 90% of it.
// Open hand-offs are never dropped: they are what a restart needs. It
// returns how many hand-offs it dropped. The compactor calls it on its
// tick and whenever the writer finds the bound reached.
func (j *Journal) TrimToSize() (int, error) {
	if j.o.MaxSize <= 0 || j.o.ReadOnly {
		return 0, nil
	}
	t := &j.trim
	t.mu.Lock()
	defer t.mu.Unlock()
	used := j.inUse()
	if used < j.o.MaxSize {
		t.stuck.Store(false)
		return 0, nil
	}
	low := int64(float64(j.o.MaxSize) * trimTo)
	total := 0
	stuck := false
	for pass := 0; used >= low && pass < maxTrimPasses; pass++ {
		req := &dropRequest{bytes: used - low}
		err := j.await(context.Background(), &request{drop: req, done: make(chan error, 1)})
		if req.dropped > 0 {
			total += req.dropped
			t.dropped += req.dropped
			t.oldestKept = req.kept
			if j.o.OnEvict != nil {
				j.o.OnEvict(req.dropped)
			}
		}
		if err != nil {
			return total, err
		}
		used = j.inUse()
		if req.dropped == 0 {
			// Nothing settled was left to drop: what remains is open.
			stuck = true
			break
		}
	}
	now := j.now()
	t.stuck.Store(stuck && used >= j.o.MaxSize)
	if stuck && used >= j.o.MaxSize && (t.erroredAt.IsZero() || now.Sub(t.erroredAt) >= logEvery) {
		t.erroredAt = now
		j.log.Error("journal: the open hand-offs alone fill journal.max_size; none of them is dropped, the file grows past it",
			"path", j.path, "in_use", used, "max_size", j.o.MaxSize, "open", j.openHandoffs())
	}
	j.warnDropped(now, used)
	return total, nil
}

// warnDropped logs the hand-offs dropped since its last line, at most once
// a minute: the compactor's tick calls it too, so a count held back is told
// within a minute or so.
func (j *Journal) warnDropped(now time.Time, used int64) {
	t := &j.trim
	if t.dropped == 0 || (!t.warnedAt.IsZero() && now.Sub(t.warnedAt) < logEvery) {
		return
	}
	if used < 0 {
		used = j.inUse()
	}
	j.log.Warn("journal: settled history dropped, the earliest first, to keep the file within journal.max_size",
		"path", j.path, "dropped", t.dropped, "oldest_kept", t.oldestKept, "in_use", used, "max_size", j.o.MaxSize)
	t.warnedAt, t.dropped = now, 0
}

// openHandoffs is the hand-offs open, for a log line.
func (j *Journal) openHandoffs() int64 {
	n, _ := j.countOpenHandoffs()
	return n
}
