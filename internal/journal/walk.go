package journal

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// walkFrom calls fn with each part of a chain, newest first, from r: its
// ref, head, records' encoding and value base time. fn returns whether to
// go on. A chain ends at a part with no link, or at one dropped from the
// log (retention, size): what is older is gone. A damaged part ends the
// walk with its error.
func walkFrom(tx *bolt.Tx, r ref, fn func(r ref, head *partHead, recs []byte, base int64) (bool, error)) error {
	return walkLenient(tx, r, fn, nil)
}

// walkLenient is walkFrom for an operator's view: a part that fails its
// checksum but whose head reads is given to bad instead, and the walk goes
// on by its link, which may be wrong (a link that does not lead back ends
// the walk). bad returns whether to go on.
func walkLenient(tx *bolt.Tx, r ref, fn func(r ref, head *partHead, recs []byte, base int64) (bool, error), bad func(r ref, head *partHead, err error) bool) error {
	log := tx.Bucket(bucketLog)
	var key [8]byte
	var v []byte
	var base int64
	seq := ^uint64(0)
	for r != 0 {
		if r.seq() != seq {
			seq = r.seq()
			binary.BigEndian.PutUint64(key[:], seq)
			if v = log.Get(key[:]); v == nil {
				return nil
			}
			var err error
			if base, err = valueBase(v); err != nil {
				return err
			}
		}
		body, _, perr := readPart(v, r.off())
		if perr != nil && (bad == nil || body == nil) {
			return perr
		}
		head, recs, err := readHead(body, seq)
		if err != nil {
			return err
		}
		if perr != nil {
			if !bad(r, &head, perr) {
				return nil
			}
		} else if more, err := fn(r, &head, recs, base); err != nil || !more {
			return err
		}
		if head.prev >= r {
			return fmt.Errorf("%w: a part links forward", ErrCorrupt)
		}
		r = head.prev
	}
	return nil
}

// chainPart is one part of a hand-off found on a walk.
type chainPart struct {
	at   ref
	recs []byte
	base int64
	bad  error // a part that failed its checksum: recs is nil
}

// history collects the parts of hand-off k from its event's chain, newest
// first, into dst: up to the part that holds its whole history (flagCopy),
// or the chain's end.
//
// lenient is for an operator's view: a damaged part of k is collected (bad
// set) and the walk goes on past it; a damage that ends the walk is
// collected as the chain's last part.
func (j *Journal) history(tx *bolt.Tx, k Key, dst []chainPart, lenient bool) ([]chainPart, error) {
	r, err := j.idx.resolve(tx, eventHash(k))
	if err != nil || r == 0 {
		return dst, err
	}
	check := keyCheck(k)
	fn := func(at ref, head *partHead, recs []byte, base int64) (bool, error) {
		if !head.names(k, check) {
			return true, nil
		}
		dst = append(dst, chainPart{at: at, recs: recs, base: base})
		return head.flags&flagCopy == 0, nil
	}
	if !lenient {
		return dst, walkFrom(tx, r, fn)
	}
	err = walkLenient(tx, r, fn, func(at ref, head *partHead, err error) bool {
		if head.names(k, check) {
			dst = append(dst, chainPart{at: at, bad: err})
		}
		return true
	})
	if err != nil {
		dst = append(dst, chainPart{bad: err})
	}
	return dst, nil
}

// handoffsFrom walks the chain of the event whose newest part is r and
// sorts its parts by hand-off: each hand-off's, newest first, up to the one
// that holds its whole history (flagCopy), in the order the walk met them.
// A part named by its key check belongs to the hand-off named in full
// further down the chain; one whose hand-off is not (its first part was
// dropped) is left out.
func handoffsFrom(tx *bolt.Tx, r ref) ([]Key, map[Key][]chainPart, error) {
	if r == 0 {
		return nil, nil, nil
	}
	type found struct {
		head partHead
		p    chainPart
	}
	var parts []found
	err := walkFrom(tx, r, func(at ref, head *partHead, recs []byte, base int64) (bool, error) {
		parts = append(parts, found{head: *head, p: chainPart{at: at, recs: recs, base: base}})
		return true, nil
	})
	if err != nil {
		return nil, nil, err
	}
	keys := map[uint32]Key{}
	for _, f := range parts {
		if f.head.flags&flagKey != 0 {
			keys[keyCheck(f.head.key)] = f.head.key
		}
	}
	var order []Key
	byKey := map[Key][]chainPart{}
	whole := map[Key]bool{}   // its whole history met (a copy part)
	for _, f := range parts { // newest first
		k, ok := f.head.key, f.head.flags&flagKey != 0
		if !ok {
			k, ok = keys[f.head.check]
		}
		if !ok || whole[k] {
			continue
		}
		if _, seen := byKey[k]; !seen {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], f.p)
		whole[k] = f.head.flags&flagCopy != 0
	}
	return order, byKey, nil
}
