package journal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Step is one record of a timeline, in write order.
type Step struct {
	Key Key
	Seq uint64
	Record
}

// Timeline returns every record of hand-off k, oldest first.
func (j *Journal) Timeline(k Key) ([]Step, error) {
	var out []Step
	prefix := k.encode(nil)
	err := j.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketSteps).Cursor()
		for key, v := c.Seek(prefix); key != nil && bytes.HasPrefix(key, prefix); key, v = c.Next() {
			if len(key) != len(prefix)+8 {
				continue // a longer key that shares the prefix
			}
			out = append(out, Step{Key: k, Seq: binary.BigEndian.Uint64(key[len(prefix):]), Record: decodeOrNote(v)})
		}
		return nil
	})
	return out, err
}

// decodeOrNote decodes a record for an operator's view. One that cannot be
// read is shown, not hidden and not fatal: Kind 0 with the reason in Detail.
func decodeOrNote(v []byte) Record {
	r, err := Decode(v)
	if err != nil {
		return Record{Detail: err.Error()}
	}
	return r
}

// Filter selects hand-offs for Scan.
type Filter struct {
	// EventID selects one event (in every source and replay).
	EventID string
	// Open selects hand-offs not yet settled.
	Open bool
	// Since selects hand-offs with a record at or after it.
	Since time.Time
}

// Scan calls fn with the timeline of each hand-off that f selects, in key
// order. It reads the whole journal: it is for operators, not the hot path.
func (j *Journal) Scan(f Filter, fn func(Key, []Step) error) error {
	return j.db.View(func(tx *bolt.Tx) error {
		open := tx.Bucket(bucketOpen)
		c := tx.Bucket(bucketSteps).Cursor()
		var cur []Step
		var curKey []byte
		flush := func() error {
			if len(cur) == 0 {
				return nil
			}
			steps := cur
			cur = nil
			k := steps[0].Key
			if f.EventID != "" && k.EventID != f.EventID {
				return nil
			}
			if f.Open && open.Get(curKey) == nil {
				return nil
			}
			if !f.Since.IsZero() && steps[len(steps)-1].At.Before(f.Since) {
				return nil
			}
			return fn(k, steps)
		}
		for key, v := c.First(); key != nil; key, v = c.Next() {
			if len(key) < 8 {
				return fmt.Errorf("%w: step key of %d bytes", ErrCorrupt, len(key))
			}
			kb := key[:len(key)-8]
			if !bytes.Equal(kb, curKey) {
				if err := flush(); err != nil {
					return err
				}
				curKey = append(curKey[:0], kb...)
			}
			k, rest, err := decodeKey(kb)
			if err != nil || len(rest) != 0 {
				return fmt.Errorf("%w: step key", ErrCorrupt)
			}
			cur = append(cur, Step{Key: k, Seq: binary.BigEndian.Uint64(key[len(kb):]), Record: decodeOrNote(v)})
		}
		return flush()
	})
}
