package journal

import (
	"encoding/binary"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Dropping history: the oldest values of the log go, a range of sequence
// numbers at a time, with the index segments that cover only them. An open
// hand-off with a part in the range is first written again at the log's
// end, whole (flagCopy): open hand-offs are what a restart needs, and are
// never dropped for size, nor for age while their latest record is
// younger than Retention.

// dropChunk bounds the bytes of values one transaction drops, so that
// dropping never holds the writer back for long. Tests lower it.
var dropChunk = 4 << 20

// dropRequest asks the writer to drop the oldest values: those whose newest
// record is older than cutoff (when set), or at least bytes of them. The writer fills in
// the rest.
type dropRequest struct {
	cutoff time.Time
	bytes  int64

	dropped int       // hand-offs whose history was dropped
	kept    time.Time // the commit time of the oldest value kept
	more    bool      // more to drop than one transaction took
}

// drop carries out req in tx, through w for the hand-offs it writes again.
func (j *Journal) drop(tx *bolt.Tx, w *logWriter, req *dropRequest) error {
	log := tx.Bucket(bucketLog)
	c := log.Cursor()
	var cut uint64 // the first sequence number kept
	var size int
	var values [][]byte
	var seqs []uint64
	for k, v := c.First(); k != nil && len(k) == 8; k, v = c.Next() {
		seq := binary.BigEndian.Uint64(k)
		base, err := valueBase(v)
		if err != nil {
			base = 0 // unreadable history is old history
		}
		old := int64(size) < req.bytes
		if !req.cutoff.IsZero() {
			old = err != nil || valueNewest(v) < req.cutoff.UnixNano()
		}
		// This transaction's own values (copies written by a pass before)
		// are never dropped by it.
		if seq >= w.seq || !old || size >= dropChunk {
			req.more = old && size >= dropChunk
			req.kept = time.Unix(0, base).UTC()
			break
		}
		size += len(v)
		values = append(values, v)
		seqs = append(seqs, seq)
		cut = seq + 1
	}
	if cut == 0 {
		return nil
	}
	if req.cutoff.IsZero() {
		closed := 0
		for _, v := range values {
			closed += j.countClosed(v)
		}
		if closed == 0 {
			// Every hand-off the range starts is open: dropping it would
			// only write them again.
			req.more = false
			return nil
		}
	}
	if _, err := j.keepOpen(tx, w, cut, req.cutoff); err != nil {
		return err
	}
	// Counted once the stale open ones are closed: they go too.
	for _, v := range values {
		req.dropped += j.countClosed(v)
	}
	j.staged.cut = cut
	// The tail is known from its parts alone: at open, a part that names
	// its event by a key check is placed by following its links back to
	// the part that names it in full, which is in the tail too (see part).
	// A cut into the tail's parts can drop that part and leave the later
	// ones unplaceable after a restart, so the tail is sealed with the
	// drop: a segment names each event's newest part outright. Under load
	// the tail is sealed long before retention reaches it; a quiet sidecar
	// seals about once a retention period.
	if cut > w.tailFrom {
		j.staged.sealNow = true
	}
	// Delete after the copies are written: they were read from these. Each
	// by its key: a cursor's First after each delete would pass over every
	// leaf emptied before it, which grows with the range.
	var key [8]byte
	for _, seq := range seqs {
		if err := log.Delete(binary.BigEndian.AppendUint64(key[:0], seq)); err != nil {
			return err
		}
	}
	gone, err := deleteSegments(tx.Bucket(bucketIndex), cut)
	j.staged.dropped = append(j.staged.dropped, gone...)
	return err
}

// countClosed is the hand-offs a value starts (the parts that name their
// key in full) whose event has none open.
func (j *Journal) countClosed(v []byte) int {
	n := 0
	partsOf(v, func(_ int, body []byte, err error) bool {
		if err != nil || len(body) == 0 || body[0]&flagKey == 0 {
			return err == nil
		}
		if k, _, err := decodeKey(body[1:]); err == nil {
			if _, open := j.openOf(eventHash(k)); !open {
				n++
			}
		}
		return true
	})
	return n
}

// keepOpen writes again, whole, every open hand-off with a part before cut,
// and closes in the index those whose latest record is older than stale
// (when set). It returns how many it wrote.
func (j *Journal) keepOpen(tx *bolt.Tx, w *logWriter, cut uint64, stale time.Time) (int, error) {
	kept := 0
	hashes := make([]uint64, 0, len(j.idx.open))
	for h := range j.idx.open {
		hashes = append(hashes, h)
	}
	for h, c := range j.staged.open {
		if _, ok := j.idx.open[h]; !ok && !c.closed {
			hashes = append(hashes, h)
		}
	}
	for _, h := range hashes {
		if _, ok := j.openOf(h); !ok {
			continue
		}
		type handoff struct {
			k    Key
			recs []Record
		}
		var again []handoff
		open := false
		err := j.eachHandoffFrom(tx, j.writerResolve(tx, h), func(k Key, recs []Record, oldest ref) {
			var t openTrack
			for i := range recs {
				t.apply(&recs[i])
			}
			if !t.open || len(recs) == 0 {
				return
			}
			if !stale.IsZero() && recs[len(recs)-1].At.Before(stale) {
				return // open, and as old as closed history: it goes
			}
			open = true
			if oldest.seq() < cut {
				again = append(again, handoff{k, recs})
			}
		})
		if err != nil {
			return kept, err
		}
		for _, a := range again {
			if err := w.part(a.k, a.recs, flagCopy); err != nil {
				return kept, err
			}
			kept++
		}
		if !open {
			j.staged.open[h] = openChange{closed: true}
		}
	}
	return kept, nil
}

// writerResolve is h's newest part for the writer: staged, or the index's.
func (j *Journal) writerResolve(tx *bolt.Tx, h uint64) ref {
	if e, ok := j.staged.tail[h]; ok {
		return e.at
	}
	if e, ok := j.idx.tail[h]; ok {
		return e.at
	}
	r, _ := j.idx.resolveSegments(tx, h)
	return r
}
