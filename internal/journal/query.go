package journal

import (
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
	if !j.idx.knows(eventHash(k)) {
		return nil, nil
	}
	err := j.db.View(func(tx *bolt.Tx) error {
		parts, err := j.history(tx, k, nil, true)
		if err != nil {
			return err
		}
		for i := len(parts) - 1; i >= 0; i-- {
			out = appendSteps(out, k, parts[i])
		}
		return nil
	})
	return out, err
}

// appendSteps appends the records of part p as steps of hand-off k. The
// steps of a part are numbered from its ref: a part takes more bytes than
// it holds records, so the numbers keep write order. A part that cannot be
// read is shown, not hidden and not fatal: Kind 0 with the reason in
// Detail.
func appendSteps(out []Step, k Key, p chainPart) []Step {
	if p.bad != nil {
		return append(out, Step{Key: k, Seq: uint64(p.at), Record: Record{Detail: p.bad.Error()}})
	}
	recs, err := readRecords(p.recs, p.base, nil)
	for i, r := range recs {
		out = append(out, Step{Key: k, Seq: uint64(p.at) + uint64(i), Record: r})
	}
	if err != nil {
		out = append(out, Step{Key: k, Seq: uint64(p.at) + uint64(len(recs)), Record: Record{Detail: err.Error()}})
	}
	return out
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
// order hand-offs first reached the journal. It reads the whole journal and
// holds its timelines in memory: it is for operators, not the hot path.
func (j *Journal) Scan(f Filter, fn func(Key, []Step) error) error {
	var order []Key
	steps := map[Key][]Step{}
	open := map[Key]*openTrack{}
	err := j.db.View(func(tx *bolt.Tx) error {
		return eachPart(tx, func(at ref, head *partHead, recs []byte, base int64, keys map[uint32]Key, bad error) error {
			k, ok := head.key, head.flags&flagKey != 0
			if !ok {
				if k, ok = keys[head.check]; !ok {
					return nil // its first part was dropped: history older than the log
				}
			}
			if f.EventID != "" && k.EventID != f.EventID {
				return nil
			}
			if _, seen := steps[k]; !seen {
				order = append(order, k)
				open[k] = &openTrack{}
			}
			if head.flags&flagCopy != 0 {
				steps[k], open[k] = steps[k][:0], &openTrack{}
			}
			n := len(steps[k])
			steps[k] = appendSteps(steps[k], k, chainPart{at: at, recs: recs, base: base, bad: bad})
			for _, s := range steps[k][n:] {
				open[k].apply(&s.Record)
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	for _, k := range order {
		st := steps[k]
		switch {
		case len(st) == 0:
		case f.Open && !open[k].open:
		case !f.Since.IsZero() && st[len(st)-1].At.Before(f.Since):
		default:
			if err := fn(k, st); err != nil {
				return err
			}
		}
	}
	return nil
}

// eachPart calls fn with every part of the log in write order, with the
// keys of the hand-offs named in full so far by their checks. A part that
// fails its checksum is given with bad set and no records.
func eachPart(tx *bolt.Tx, fn func(at ref, head *partHead, recs []byte, base int64, keys map[uint32]Key, bad error) error) error {
	keys := map[uint32]Key{}
	c := tx.Bucket(bucketLog).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return fmt.Errorf("%w: log key of %d bytes", ErrCorrupt, len(k))
		}
		seq := binary.BigEndian.Uint64(k)
		base, err := valueBase(v)
		if err != nil {
			return err
		}
		var ferr error
		partsOf(v, func(off int, body []byte, perr error) bool {
			if body == nil {
				ferr = perr
				return false
			}
			head, recs, err := readHead(body, seq)
			if err != nil {
				ferr = err
				return false
			}
			if perr != nil {
				// Shown under the hand-off its head names, if it does.
				recs = nil
			}
			if head.flags&flagKey != 0 {
				keys[keyCheck(head.key)] = head.key
			}
			ferr = fn(makeRef(seq, off), &head, recs, base, keys, perr)
			return ferr == nil
		})
		if ferr != nil {
			return ferr
		}
	}
	return nil
}

// openTrack follows whether one hand-off is open, as trackOpen does for
// the index.
type openTrack struct {
	open bool
	hop  int
}

func (t *openTrack) apply(r *Record) {
	switch r.Kind {
	case Received:
		if !t.open || r.Hop > t.hop {
			t.hop = r.Hop
		}
		t.open = true
	case Settled:
		if t.open && t.hop <= r.Hop {
			t.open = false
		}
	}
}

// Event returns the timeline of every hand-off of one event of one source:
// the original's first, then each replay's, in replay id order. It is nil
// when the journal holds none.
func (j *Journal) Event(source, eventID string) ([][]Step, error) {
	k0 := Key{Source: source, EventID: eventID}
	h := eventHash(k0)
	if !j.idx.knows(h) {
		return nil, nil
	}
	var out [][]Step
	err := j.db.View(func(tx *bolt.Tx) error {
		r, err := j.idx.resolve(tx, h)
		if err != nil {
			return err
		}
		order, byKey, err := handoffsFrom(tx, r)
		if err != nil {
			return err
		}
		// Another event's, where two share a hash, are not this one's.
		order = slices.DeleteFunc(order, func(k Key) bool { return k.Source != source || k.EventID != eventID })
		slices.SortFunc(order, func(a, b Key) int { return strings.Compare(a.ReplayID, b.ReplayID) })
		for _, k := range order {
			ps := byKey[k]
			var steps []Step
			for i := len(ps) - 1; i >= 0; i-- {
				steps = appendSteps(steps, k, ps[i])
			}
			out = append(out, steps)
		}
		return nil
	})
	return out, err
}
