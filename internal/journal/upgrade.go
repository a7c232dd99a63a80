package journal

import (
	"bytes"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Format 1's buckets: records keyed by key ‖ seq, the indexes by key.
var (
	bucketSteps   = []byte("steps")   // key ‖ seq → record
	bucketOpen    = []byte("open")    // key → opened-at ‖ hop
	bucketSettled = []byte("settled") // settled-at ‖ key → nothing
)

// upgradeChunk bounds the records moved in one transaction.
var upgradeChunk = 4096

// upgrade moves a format 1 journal into the current format, hand-off by
// hand-off, in transactions of a bounded size: each moves whole hand-offs
// and deletes them from the old buckets, so a crash part way leaves a journal
// that the next start goes on upgrading. The indexes are rebuilt from the
// records, the way the writer keeps them. The last transaction drops the old
// buckets and sets the format.
func (j *Journal) upgrade() error {
	j.log.Info("upgrading the journal to a new format", "path", j.path, "from", 1, "to", formatVersion)
	for {
		done := false
		err := j.update(func(tx *bolt.Tx) error {
			if err := createBuckets(tx); err != nil {
				return err
			}
			steps := tx.Bucket(bucketSteps)
			var batch []*request
			n := 0
			c := steps.Cursor()
			k, v := c.First()
			for k != nil && n < upgradeChunk {
				if len(k) < 8 {
					return fmt.Errorf("%w: step key of %d bytes", ErrCorrupt, len(k))
				}
				key := append([]byte(nil), k[:len(k)-8]...)
				req := &request{key: key}
				for ; k != nil && len(k) == len(key)+8 && bytes.HasPrefix(k, key); k, v = c.Next() {
					r, err := Decode(v)
					if err != nil {
						return fmt.Errorf("hand-off %x: %w", key, err)
					}
					req.recs = append(req.recs, r)
				}
				batch = append(batch, req)
				n += len(req.recs)
			}
			if _, err := j.write(tx, batch); err != nil {
				return err
			}
			for _, r := range batch {
				if err := deletePrefix(steps, r.key); err != nil {
					return err
				}
			}
			if j.o.BeforeCommit != nil {
				if err := j.o.BeforeCommit(n); err != nil {
					return err
				}
			}
			if k, _ := steps.Cursor().First(); k != nil {
				return nil
			}
			for _, name := range [][]byte{bucketSteps, bucketOpen, bucketSettled} {
				if err := tx.DeleteBucket(name); err != nil {
					return err
				}
			}
			done = true
			return tx.Bucket(bucketMeta).Put(metaFormat, binary.BigEndian.AppendUint32(nil, formatVersion))
		})
		if err != nil {
			return &upgradeError{err}
		}
		if done {
			return nil
		}
	}
}

// deletePrefix deletes every format 1 step of the hand-off keyed prefix.
func deletePrefix(b *bolt.Bucket, prefix []byte) error {
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && len(k) == len(prefix)+8; k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	return nil
}

// upgradeError is a failed upgrade of a journal that was read whole: the
// file is not damaged (what was not moved yet is still in the old buckets),
// and the next start goes on.
type upgradeError struct{ err error }

func (e *upgradeError) Error() string {
	return fmt.Sprintf("upgrading the journal to format %d: %v (the next start goes on where this one stopped)", formatVersion, e.err)
}

func (e *upgradeError) Unwrap() error { return e.err }
