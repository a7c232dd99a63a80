package journal

import (
	"bytes"
	"encoding/binary"
	"time"

	bolt "go.etcd.io/bbolt"
)

// tree is the journal's buckets in one transaction, with the keys not yet
// in the ids bucket.
type tree struct {
	ids, records, pending, expiry *bolt.Bucket
	recent                        *recentIndex
	// Cursors made on first use and kept for the transaction's point
	// reads: Bucket.Get makes a cursor, and grows its stack, on every call.
	idsAt, pendingAt *bolt.Cursor
}

func (j *Journal) buckets(tx *bolt.Tx) tree {
	b := tree{ids: tx.Bucket(bucketIDs), records: tx.Bucket(bucketRecords),
		pending: tx.Bucket(bucketPending), expiry: tx.Bucket(bucketExpiry), recent: j.recent}
	if b.expiry != nil {
		// Settle times rise, so the index grows at its end, where bbolt's
		// default split leaves pages half full: 0.9 fills them to 89%, 30
		// bytes a hand-off less. The records bucket grows near its end but
		// not at it (the hand-offs in flight write just before the end),
		// and a split that leaves pages fuller only splits them again.
		b.expiry.FillPercent = fillAtEnd
	}
	return b
}

// fillAtEnd is how full a page split at the expiry index's end is left.
const fillAtEnd = 0.9

// get reads the value of key k, like Bucket.Get, through *c, which it makes
// from bk when it is nil.
func get(bk *bolt.Bucket, c **bolt.Cursor, k []byte) []byte {
	if *c == nil {
		*c = bk.Cursor()
	}
	if key, v := (*c).Seek(k); bytes.Equal(key, k) {
		return v
	}
	return nil
}

// lookup returns the id of the hand-off with encoded key k, or nil.
func (b *tree) lookup(k []byte) []byte {
	if b.recent != nil {
		if id := b.recent.get(k); id != nil {
			return id
		}
	}
	id := get(b.ids, &b.idsAt, k)
	if len(id) != idLen {
		return nil
	}
	return id
}

// id returns the id of the hand-off with encoded key k, and whether it is
// new: one with none is given the next, and its key record written. Its
// entry in the ids bucket is written now when index, else by a later merge
// (recent.go).
func (b *tree) id(k []byte, index bool) ([]byte, bool, error) {
	if id := b.lookup(k); id != nil {
		return id, false, nil
	}
	n, err := b.ids.NextSequence()
	if err != nil {
		return nil, false, err
	}
	id := binary.BigEndian.AppendUint64(make([]byte, 0, 2*idLen), n)
	if index {
		if err := b.ids.Put(k, id); err != nil {
			return nil, false, err
		}
	}
	return id, true, b.records.Put(binary.BigEndian.AppendUint64(id[:idLen:idLen], 0), k)
}

// index keeps the pending and expiry indexes. A pending entry holds the time
// the hand-off opened and its latest hop; a settle of an earlier hop (which
// can land after the next hop was received) leaves it pending.
func (b *tree) index(id []byte, rec *Record) error {
	switch rec.Kind {
	case Received:
		v := get(b.pending, &b.pendingAt, id)
		if v == nil {
			return b.pending.Put(id, openValue(rec.At, rec.Hop))
		}
		if at, hop, ok := parseOpenValue(v); ok && rec.Hop > hop {
			return b.pending.Put(id, openValue(at, rec.Hop))
		}
	case Settled:
		if v := get(b.pending, &b.pendingAt, id); v != nil {
			if _, hop, ok := parseOpenValue(v); !ok || hop <= rec.Hop {
				if err := b.pending.Delete(id); err != nil {
					return err
				}
			}
		}
		return b.expiry.Put(append(appendTime(make([]byte, 0, 2*idLen), rec.At), id...), nil)
	}
	return nil
}

// each calls fn with the seq and value of every record of hand-off id, in
// write order, and returns the key record (nil when it is missing).
func (b tree) each(id []byte, fn func(seq uint64, v []byte) error) ([]byte, error) {
	var key []byte
	c := b.records.Cursor()
	for k, v := c.Seek(id); k != nil && len(k) == 2*idLen && bytes.Equal(k[:idLen], id); k, v = c.Next() {
		seq := binary.BigEndian.Uint64(k[idLen:])
		if seq == 0 {
			key = v
			continue
		}
		if err := fn(seq, v); err != nil {
			return key, err
		}
	}
	return key, nil
}

func openValue(at time.Time, hop int) []byte {
	return binary.AppendUvarint(appendTime(make([]byte, 0, 8+binary.MaxVarintLen64), at), uint64(hop))
}

func parseOpenValue(v []byte) (time.Time, int, bool) {
	if len(v) < 8 {
		return time.Time{}, 0, false
	}
	hop, w := binary.Uvarint(v[8:])
	if w <= 0 {
		return time.Time{}, 0, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v[:8]))), int(hop), true
}

// appendTime appends t as big-endian Unix nanoseconds, which sort by time.
func appendTime(dst []byte, t time.Time) []byte {
	return binary.BigEndian.AppendUint64(dst, uint64(t.UnixNano()))
}
