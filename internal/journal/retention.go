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
		case <-t.C:
		}
		if n, err := j.Compact(); err != nil {
			j.log.Warn("journal compaction failed", "err", err)
		} else if n > 0 {
			j.log.Debug("journal compacted", "removed", n)
		}
	}
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
		steps, open, settled := tx.Bucket(bucketSteps), tx.Bucket(bucketOpen), tx.Bucket(bucketSettled)
		c := settled.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.First() {
			if len(k) < 8 || binary.BigEndian.Uint64(k[:8]) >= limit {
				break
			}
			if removed == compactChunk {
				more = true
				return nil
			}
			key := append([]byte(nil), k[8:]...)
			if err := c.Delete(); err != nil {
				return err
			}
			// A later hop may have reopened the hand-off, or settled it
			// again later: only a hand-off whose latest record is old goes.
			if open.Get(key) != nil || lastAt(steps, key) >= limit {
				continue
			}
			if err := deletePrefix(steps, key); err != nil {
				return err
			}
			removed++
		}
		var stale [][]byte
		oc := open.Cursor()
		for k, _ := oc.First(); k != nil; k, _ = oc.Next() {
			if removed+len(stale) == compactChunk {
				more = true
				break
			}
			if lastAt(steps, k) < limit {
				stale = append(stale, append([]byte(nil), k...))
			}
		}
		for _, key := range stale {
			if err := deletePrefix(steps, key); err != nil {
				return err
			}
			if err := open.Delete(key); err != nil {
				return err
			}
			removed++
		}
		return nil
	})
	return removed, more, err
}

// lastAt is the time of the latest record of key, as Unix nanoseconds.
func lastAt(steps *bolt.Bucket, key []byte) uint64 {
	c := steps.Cursor()
	var last []byte
	for k, v := c.Seek(key); k != nil && bytes.HasPrefix(k, key) && len(k) == len(key)+8; k, v = c.Next() {
		last = v
	}
	if last == nil {
		return 0
	}
	r, err := Decode(last)
	if err != nil {
		return 0 // unreadable history is old history
	}
	return uint64(r.At.UnixNano())
}

func deletePrefix(b *bolt.Bucket, prefix []byte) error {
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && len(k) == len(prefix)+8; k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}
