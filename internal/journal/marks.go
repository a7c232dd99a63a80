package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"

	bolt "go.etcd.io/bbolt"
)

// Marks are named high-water marks a source keeps in the journal: a Kafka
// partition's highest offset handed out, written before its records are,
// so that after a crash the records at or below it are known to have
// perhaps reached the app already, even when the crash took the records
// that said so with it. They live in the meta bucket, under markPrefix.

var markPrefix = []byte("mark:")

func markKey(name string) []byte { return append(append([]byte(nil), markPrefix...), name...) }

// SetMarks stores each mark and returns once they are durable. A mark never
// moves back: a lower value than the stored one is left out.
func (j *Journal) SetMarks(ctx context.Context, marks map[string]int64) error {
	if len(marks) == 0 {
		return nil
	}
	return j.await(ctx, &request{marks: marks, done: make(chan error, 1)})
}

// Mark is the stored mark called name.
func (j *Journal) Mark(name string) (v int64, ok bool, err error) {
	err = j.db.View(func(tx *bolt.Tx) error {
		v, ok = getMark(tx.Bucket(bucketMeta), name)
		return nil
	})
	return v, ok, err
}

func getMark(meta *bolt.Bucket, name string) (int64, bool) {
	b := meta.Get(markKey(name))
	if len(b) != 8 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(b)), true
}

// putMarks writes a request's marks in tx.
func putMarks(tx *bolt.Tx, marks map[string]int64) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		return errors.New("journal: no meta bucket")
	}
	for name, v := range marks {
		if old, ok := getMark(meta, name); ok && old >= v {
			continue
		}
		if err := meta.Put(markKey(name), binary.BigEndian.AppendUint64(nil, uint64(v))); err != nil {
			return err
		}
	}
	return nil
}

// readMarks is every mark in meta.
func readMarks(meta *bolt.Bucket) map[string]int64 {
	marks := map[string]int64{}
	c := meta.Cursor()
	for k, v := c.Seek(markPrefix); k != nil && bytes.HasPrefix(k, markPrefix); k, v = c.Next() {
		if len(v) == 8 {
			marks[string(k[len(markPrefix):])] = int64(binary.BigEndian.Uint64(v))
		}
	}
	return marks
}
