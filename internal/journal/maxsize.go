package journal

import (
	"encoding/binary"
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
	total, more := 0, true
	for more && used >= low {
		n, kept, m, err := j.evictOnce(compactChunk)
		more = m
		if n > 0 {
			total += n
			t.dropped += n
			t.oldestKept = kept
			if j.o.OnEvict != nil {
				j.o.OnEvict(n)
			}
		}
		if err != nil {
			return total, err
		}
		used = j.inUse()
	}
	now := j.now()
	t.stuck.Store(used >= j.o.MaxSize)
	if used >= j.o.MaxSize && (t.erroredAt.IsZero() || now.Sub(t.erroredAt) >= logEvery) {
		t.erroredAt = now
		j.log.Error("journal: the open hand-offs alone fill journal.max_size; none of them is dropped, the file grows past it",
			"path", j.path, "in_use", used, "max_size", j.o.MaxSize, "open", j.openCount())
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

// evictOnce drops up to limit settled hand-offs in one transaction, the
// earliest settle first, and returns how many it dropped, the settle time
// of the earliest one kept, and whether settled hand-offs are left.
func (j *Journal) evictOnce(limit int) (removed int, oldestKept time.Time, more bool, err error) {
	err = j.db.Update(func(tx *bolt.Tx) error {
		b := j.buckets(tx)
		c := b.expiry.Cursor()
		visited := 0
		k, _ := c.First()
		for ; k != nil && visited < limit; k, _ = c.First() {
			visited++
			if len(k) != 2*idLen {
				if err := c.Delete(); err != nil { // names no hand-off
					return err
				}
				continue
			}
			at := binary.BigEndian.Uint64(k[:idLen])
			id := append([]byte(nil), k[idLen:]...)
			if err := c.Delete(); err != nil {
				return err
			}
			// Reopened by a later hop: it is open, and its next settle
			// indexes it again.
			if b.pending.Get(id) != nil {
				continue
			}
			// Settled again later, or written to after its settle: it goes
			// in the order of its latest record, not of this one.
			if last := b.lastAt(id); last > at {
				if err := b.expiry.Put(append(binary.BigEndian.AppendUint64(make([]byte, 0, 2*idLen), last), id...), nil); err != nil {
					return err
				}
				continue
			}
			if err := j.remove(b, id); err != nil {
				return err
			}
			removed++
		}
		if k != nil {
			more = true
			if len(k) == 2*idLen {
				oldestKept = time.Unix(0, int64(binary.BigEndian.Uint64(k[:idLen]))).UTC()
			}
		}
		return nil
	})
	return removed, oldestKept, more, err
}

// openCount is the hand-offs in the pending index.
func (j *Journal) openCount() int {
	n := 0
	_ = j.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketPending); b != nil {
			n = b.Stats().KeyN
		}
		return nil
	})
	return n
}
