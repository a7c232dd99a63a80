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
// that the next start goes on upgrading. Records are moved as they are; the
// indexes are rebuilt from those that can be read, the way the writer keeps
// them (one that cannot be read is kept, and shows as unreadable, as it did).
// Hand-offs moved this way are numbered in key order, and their records get
// new sequence numbers in the order they had. The last transaction drops the
// old buckets and sets the format.
func (j *Journal) upgrade() error {
	j.log.Info("upgrading the journal to a new format", "path", j.path, "from", 1, "to", formatVersion)
	for {
		done := false
		err := j.db.Update(func(tx *bolt.Tx) error {
			if err := createBuckets(tx); err != nil {
				return err
			}
			b := j.buckets(tx)
			ids := j.resolver(tx, &b)
			// Indexed at once: the upgrade's last transaction says every
			// key is in the bucket.
			ids.index = true
			steps := tx.Bucket(bucketSteps)
			n := 0
			for n < upgradeChunk {
				k, _ := steps.Cursor().First()
				if k == nil {
					break
				}
				if len(k) < 8 {
					return fmt.Errorf("%w: step key of %d bytes", ErrCorrupt, len(k))
				}
				key := append([]byte(nil), k[:len(k)-8]...)
				id, err := ids.id(key)
				if err != nil {
					return err
				}
				c := steps.Cursor()
				for k, v := c.Seek(key); k != nil && len(k) == len(key)+8 && bytes.HasPrefix(k, key); k, v = c.Seek(key) {
					seq, err := b.records.NextSequence()
					if err != nil {
						return err
					}
					raw := bytes.Clone(v)
					if err := b.records.Put(binary.BigEndian.AppendUint64(bytes.Clone(id), seq), raw); err != nil {
						return err
					}
					if rec, err := Decode(raw); err == nil {
						if err := b.index(id, &rec); err != nil {
							return err
						}
					}
					if err := c.Delete(); err != nil {
						return err
					}
					n++
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

// upgradeError is a failed upgrade of a journal that was read whole: the
// file is not damaged (what was not moved yet is still in the old buckets),
// and the next start goes on.
type upgradeError struct{ err error }

func (e *upgradeError) Error() string {
	return fmt.Sprintf("upgrading the journal to format %d: %v (the next start goes on where this one stopped)", formatVersion, e.err)
}

func (e *upgradeError) Unwrap() error { return e.err }
