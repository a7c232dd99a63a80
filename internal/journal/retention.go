package journal

import (
	"bytes"
	"encoding/binary"
	"time"

	bolt "go.etcd.io/bbolt"
)

// compactChunk bounds the hand-offs removed in one transaction, so
// compaction never holds the writer back for long.
const compactChunk = 512

func (j *Journal) compactor() {
	defer j.wg.Done()
	t := time.NewTicker(j.o.CompactEvery)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-j.trimNow:
			j.trimToSize()
			continue
		case <-t.C:
		}
		if n, err := j.Compact(); err != nil {
			j.log.Warn("journal compaction failed", "err", err)
		} else if n > 0 {
			j.log.Debug("journal compacted", "removed", n)
		}
		j.trimToSize()
	}
}

// trimToSize is TrimToSize for the compactor, which also tells what a
// trim within the last minute held back.
func (j *Journal) trimToSize() {
	if _, err := j.TrimToSize(); err != nil {
		j.log.Warn("journal: dropping settled history to keep within journal.max_size failed", "err", err)
	}
	j.trim.mu.Lock()
	j.warnDropped(j.now(), -1)
	j.trim.mu.Unlock()
}

// Compact removes hand-offs settled longer than Retention ago, and open ones
// older than that (their settle record was lost, or their message never came
// back). It returns how many hand-offs it removed.
func (j *Journal) Compact() (int, error) {
	cutoff := j.now().Add(-j.o.Retention)
	total := 0
	for {
		n, more, err := j.compactOnce(cutoff)
		total += n
		if err != nil || !more {
			return total, err
		}
	}
}

func (j *Journal) compactOnce(cutoff time.Time) (removed int, more bool, err error) {
	limit := uint64(cutoff.UnixNano())
	err = j.db.Update(func(tx *bolt.Tx) error {
		b := j.buckets(tx)
		c := b.expiry.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.First() {
			if len(k) != 2*idLen || binary.BigEndian.Uint64(k[:idLen]) >= limit {
				break
			}
			if removed == compactChunk {
				more = true
				return nil
			}
			id := append([]byte(nil), k[idLen:]...)
			if err := c.Delete(); err != nil {
				return err
			}
			// A later hop may have reopened the hand-off, or settled it
			// again later: only a hand-off whose latest record is old goes.
			if b.pending.Get(id) != nil || b.lastAt(id) >= limit {
				continue
			}
			if err := j.remove(b, id); err != nil {
				return err
			}
			removed++
		}
		var stale [][]byte
		oc := b.pending.Cursor()
		for k, _ := oc.First(); k != nil; k, _ = oc.Next() {
			if removed+len(stale) == compactChunk {
				more = true
				break
			}
			if b.lastAt(k) < limit {
				stale = append(stale, append([]byte(nil), k...))
			}
		}
		for _, id := range stale {
			if err := j.remove(b, id); err != nil {
				return err
			}
			if err := b.pending.Delete(id); err != nil {
				return err
			}
			removed++
		}
		return nil
	})
	return removed, more, err
}

// lastAt is the time of the latest record of hand-off id, as Unix
// nanoseconds.
func (b tree) lastAt(id []byte) uint64 {
	var last []byte
	_, _ = b.each(id, func(_ uint64, v []byte) error {
		last = v
		return nil
	})
	if last == nil {
		return 0
	}
	r, err := Decode(last)
	if err != nil {
		return 0 // unreadable history is old history
	}
	return uint64(r.At.UnixNano())
}

// remove deletes hand-off id's records and its entry in the key index and
// the id cache.
func (j *Journal) remove(b tree, id []byte) error {
	c := b.records.Cursor()
	for k, v := c.Seek(id); k != nil && len(k) == 2*idLen && bytes.Equal(k[:idLen], id); k, v = c.Seek(id) {
		if binary.BigEndian.Uint64(k[idLen:]) == 0 {
			j.ids.remove(v)
			j.recent.remove(v, id)
			// Only the index entry that points here: should a key ever
			// have had a second id, that one stays reachable.
			if bytes.Equal(b.ids.Get(v), id) {
				if err := b.ids.Delete(v); err != nil {
					return err
				}
			}
		}
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}
