package journal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
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
	err := j.db.View(func(tx *bolt.Tx) error {
		b := j.buckets(tx)
		id := b.lookup(k.encode(nil))
		if id == nil {
			return nil
		}
		_, err := b.each(id, func(seq uint64, v []byte) error {
			out = append(out, Step{Key: k, Seq: seq, Record: decodeOrNote(v)})
			return nil
		})
		return err
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

// Scan calls fn with the timeline of each hand-off that f selects, in the
// order hand-offs first reached the journal. It reads the whole journal: it
// is for operators, not the hot path.
func (j *Journal) Scan(f Filter, fn func(Key, []Step) error) error {
	return j.db.View(func(tx *bolt.Tx) error {
		b := j.buckets(tx)
		var cur []Step
		var curID []byte
		var curKey Key
		flush := func() error {
			steps := cur
			cur = nil
			if len(steps) == 0 {
				return nil
			}
			if f.EventID != "" && curKey.EventID != f.EventID {
				return nil
			}
			if f.Open && b.pending.Get(curID) == nil {
				return nil
			}
			if !f.Since.IsZero() && steps[len(steps)-1].At.Before(f.Since) {
				return nil
			}
			return fn(curKey, steps)
		}
		c := b.records.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 2*idLen {
				return fmt.Errorf("%w: record key of %d bytes", ErrCorrupt, len(k))
			}
			id, seq := k[:idLen], binary.BigEndian.Uint64(k[idLen:])
			if seq == 0 { // a hand-off's key: its records follow
				if err := flush(); err != nil {
					return err
				}
				key, rest, err := decodeKey(v)
				if err != nil || len(rest) != 0 {
					return fmt.Errorf("%w: hand-off key", ErrCorrupt)
				}
				curID, curKey = append(curID[:0], id...), key
				continue
			}
			if !bytes.Equal(id, curID) {
				return fmt.Errorf("%w: records of hand-off %x without its key", ErrCorrupt, id)
			}
			cur = append(cur, Step{Key: curKey, Seq: seq, Record: decodeOrNote(v)})
		}
		return flush()
	})
}

// Event returns the timeline of every hand-off of one event of one source:
// the original's first, then each replay's, in replay id order. It is nil
// when the journal holds none.
func (j *Journal) Event(source, eventID string) ([][]Step, error) {
	// The keys of one event's hand-offs share the encoding of its source
	// and event id, and differ only in the replay id that follows: one
	// seek finds them all.
	prefix := Key{Source: source, EventID: eventID}.encode(nil)
	prefix = prefix[:len(prefix)-1] // the empty replay id's length
	var out [][]Step
	err := j.db.View(func(tx *bolt.Tx) error {
		b := j.buckets(tx)
		// The keys in the bucket and those waiting to be merged into it,
		// in key order; a key in both names the same id.
		var found []recentEntry
		c := b.ids.Cursor()
		for k, id := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, id = c.Next() {
			found = append(found, recentEntry{string(k), id})
		}
		found = append(found, j.recent.withPrefix(prefix)...)
		slices.SortStableFunc(found, func(a, b recentEntry) int { return strings.Compare(a.key, b.key) })
		found = slices.CompactFunc(found, func(a, b recentEntry) bool { return a.key == b.key })
		for _, e := range found {
			id := e.id
			key, rest, err := decodeKey([]byte(e.key))
			if err != nil || len(rest) != 0 || len(id) != idLen {
				return fmt.Errorf("%w: hand-off key", ErrCorrupt)
			}
			var steps []Step
			if _, err := b.each(id, func(seq uint64, v []byte) error {
				steps = append(steps, Step{Key: key, Seq: seq, Record: decodeOrNote(v)})
				return nil
			}); err != nil {
				return err
			}
			if len(steps) > 0 {
				out = append(out, steps)
			}
		}
		return nil
	})
	return out, err
}
