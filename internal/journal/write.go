package journal

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// valueFits is how large a value may grow before the writer starts another:
// a quarter of a page, so that a leaf page holds a few values and bbolt
// splits its nodes a page each. A node of fewer than five values is never
// split, so values near a page long make leaves of two or more pages,
// half empty, that need runs of free pages which dropping the oldest
// rarely leaves: the file would grow. A part larger than this is a value
// of its own.
func (j *Journal) valueFits() int { return int(j.pageSize)/4 - 64 }

// tailEntry is the tail index's entry for an event: its newest part and
// that part's key check, so the writer knows without a read whether the
// next part of the event is of the same hand-off.
type tailEntry struct {
	at    ref
	check uint32
}

// staging is the index as the batch being written leaves it: the writer
// reads through it, and it is applied once the batch commits, so that a
// reader never follows a ref into a transaction that did not commit.
type staging struct {
	tail map[uint64]tailEntry
	open map[uint64]openChange
	// seal is the segment this batch sealed (nil: none): once applied the
	// tail starts empty.
	seal *segment
	// dropped are the segments this batch dropped.
	dropped []uint64
	// nextSeq is the next sequence number once the batch commits.
	nextSeq uint64
	// cut is the first sequence number kept, once a drop in this batch
	// dropped those before it: the tail's entries below it go.
	cut uint64
	// sealNow: the batch's drop cut into the tail's parts, so the tail is
	// sealed with it (see drop).
	sealNow bool
}

type openChange struct {
	entry  openEntry
	closed bool
}

func (s *staging) reset() {
	if s.tail == nil {
		s.tail = make(map[uint64]tailEntry)
		s.open = make(map[uint64]openChange)
	}
	clear(s.tail)
	clear(s.open)
	s.seal, s.dropped, s.nextSeq, s.cut, s.sealNow = nil, s.dropped[:0], 0, 0, false
}

// logWriter appends parts to the log within one transaction.
type logWriter struct {
	j        *Journal
	tx       *bolt.Tx
	log      *bolt.Bucket
	now      time.Time
	base     int64
	seq      uint64 // the value being written
	start    int    // where it starts in the slab
	newestAt int64  // its newest record's time
	// tailFrom is the first sequence number after the newest segment: the
	// tail's parts, which open reads to know the tail (loadTail).
	tailFrom uint64
}

func (j *Journal) logWriter(tx *bolt.Tx) logWriter {
	log := tx.Bucket(bucketLog)
	// Keys only grow: a full page is never split again.
	log.FillPercent = 1
	now := j.now()
	j.staged.nextSeq = j.nextSeq
	j.slab = appendValueHeader(j.slab[:0], now)
	tailFrom := uint64(1)
	if n := len(j.idx.segs); n > 0 { // the writer's own: no lock to read
		tailFrom = j.idx.segs[n-1].last + 1
	}
	return logWriter{j: j, tx: tx, log: log, now: now, base: now.UnixNano(), seq: j.nextSeq, tailFrom: tailFrom}
}

// part appends the records of hand-off k. flags may ask for flagCopy.
func (w *logWriter) part(k Key, recs []Record, flags byte) error {
	j := w.j
	for i := range recs {
		if recs[i].At.IsZero() {
			w.newestAt = max(w.newestAt, w.base) // written at the base time
		} else {
			w.newestAt = max(w.newestAt, recs[i].At.UnixNano())
		}
	}
	h, check := hashes(k)
	prev, prevCheck, known, err := w.newest(h)
	if err != nil {
		return err
	}
	if !known || prevCheck != check || flags&flagCopy != 0 || prev.seq() < w.tailFrom {
		// The first part of this hand-off in its event's chain, as far
		// as the writer can tell cheaply, or one that holds its whole
		// history (what it follows is dropped): it names its key in full.
		// So does one that follows a part sealed in a segment: open reads
		// the tail's parts alone, and a part named by its key check is
		// placed by the part that names it, which must be in the tail too
		// (a drop may take the older one; see drop).
		flags |= flagKey
	}
	off := len(j.slab) - w.start
	j.slab = appendPart(j.slab, w.seq, flags, k, check, prev, recs, w.base)
	if len(j.slab)-w.start > j.valueFits() && off > valueHeader {
		// It does not fit what is left of this value: the next one.
		j.slab = j.slab[:w.start+off]
		if err := w.next(); err != nil {
			return err
		}
		off = len(j.slab) - w.start
		j.slab = appendPart(j.slab, w.seq, flags, k, check, prev, recs, w.base)
	}
	if len(j.slab)-w.start > maxValue {
		return fmt.Errorf("journal: hand-off %s: %d bytes of records in one commit", k, len(j.slab)-w.start)
	}
	r := makeRef(w.seq, off)
	j.staged.tail[h] = tailEntry{at: r, check: check}
	j.trackOpen(h, r, recs)
	return nil
}

// newest is h's newest part: staged, in the tail, or in a segment (whose
// key check is then read from the part itself).
func (w *logWriter) newest(h uint64) (ref, uint32, bool, error) {
	j := w.j
	if e, ok := j.staged.tail[h]; ok {
		return e.at, e.check, true, nil
	}
	if e, ok := j.idx.tail[h]; ok && e.at.seq() >= j.staged.cut { // the writer's own map: no lock to read
		return e.at, e.check, true, nil
	}
	r, err := j.idx.resolveSegments(w.tx, h)
	if err != nil || r == 0 {
		return 0, 0, false, err
	}
	var check uint32
	var found bool
	err = walkFrom(w.tx, r, func(_ ref, head *partHead, _ []byte, _ int64) (bool, error) {
		if head.flags&flagKey != 0 {
			check = keyCheck(head.key)
		} else {
			check = head.check
		}
		found = true
		return false, nil
	})
	if err != nil || !found {
		// Unreadable or dropped: the next part starts a chain of its own.
		return 0, 0, false, nil
	}
	return r, check, true, nil
}

// next puts the value being written and starts another.
func (w *logWriter) next() error {
	if err := w.put(); err != nil {
		return err
	}
	w.seq++
	w.j.staged.nextSeq = w.seq
	w.start, w.newestAt = len(w.j.slab), 0
	w.j.slab = appendValueHeader(w.j.slab, w.now)
	return nil
}

func (w *logWriter) put() error {
	j := w.j
	v := j.slab[w.start:len(j.slab):len(j.slab)]
	setNewest(v, w.newestAt)
	k := binary.BigEndian.AppendUint64(make([]byte, 0, 8), w.seq)
	if err := w.log.Put(k, v); err != nil {
		return err
	}
	w.j.staged.nextSeq = w.seq + 1
	return nil
}

// flush puts the last value, if it holds a part.
func (w *logWriter) flush() error {
	if len(w.j.slab)-w.start <= valueHeader {
		return nil
	}
	return w.put()
}

// trackOpen follows whether the hand-offs of event h are open, the way the
// records say: a receipt opens one, a settle of its latest hop closes it.
func (j *Journal) trackOpen(h uint64, r ref, recs []Record) {
	cur, was := j.openOf(h)
	if cur, ok := openStep(cur, was, recs); ok {
		cur.at = r
		j.staged.open[h] = openChange{entry: cur}
	} else if was {
		j.staged.open[h] = openChange{closed: true}
	}
}

// openStep is an event's open entry after recs: a receipt opens it, a
// settle of its latest hop closes it.
func openStep(cur openEntry, ok bool, recs []Record) (openEntry, bool) {
	for i := range recs {
		switch recs[i].Kind {
		case Received:
			if !ok || recs[i].Hop > cur.hop {
				cur.hop = recs[i].Hop
			}
			ok = true
		case Settled:
			if ok && cur.hop <= recs[i].Hop {
				ok = false
			}
		}
	}
	return cur, ok
}

// openOf is h's open entry as the batch leaves it so far.
func (j *Journal) openOf(h uint64) (openEntry, bool) {
	if c, ok := j.staged.open[h]; ok {
		return c.entry, !c.closed
	}
	e, ok := j.idx.open[h] // the writer's own map: no lock to read
	return e, ok
}

// maybeSeal seals the tail when it has grown to sealAt events, or when a
// drop cut into its parts (sealNow).
func (j *Journal) maybeSeal(tx *bolt.Tx) error {
	n := len(j.idx.tail) + len(j.staged.tail)
	if n == 0 || n < sealAt && !j.staged.sealNow {
		return nil
	}
	// The tail's entries and the batch's, in one slice sorted by hash
	// rather than merged in a map: at a seal the tail holds sealAt events,
	// and a copy of it would be megabytes made and dropped. An event in
	// both keeps the batch's entry, whose ref is the later.
	cut := j.staged.cut // parts this batch dropped are no one's newest any more
	entries := make([]indexEntry, 0, n)
	for _, m := range [2]map[uint64]tailEntry{j.idx.tail, j.staged.tail} {
		for h, e := range m {
			if e.at.seq() >= cut {
				entries = append(entries, indexEntry{h: h, r: e.at})
			}
		}
	}
	if len(entries) == 0 {
		return nil
	}
	slices.SortFunc(entries, func(a, b indexEntry) int {
		if c := cmp.Compare(a.h, b.h); c != 0 {
			return c
		}
		return cmp.Compare(b.r, a.r) // the later ref first, kept by Compact
	})
	entries = slices.CompactFunc(entries, func(a, b indexEntry) bool { return a.h == b.h })
	bloom := newBloom()
	for _, e := range entries {
		bloomAdd(bloom, e.h)
	}
	open := make(map[uint64]openEntry, len(j.idx.open))
	for h, e := range j.idx.open {
		open[h] = e
	}
	for h, c := range j.staged.open {
		if c.closed {
			delete(open, h)
		} else {
			open[h] = c.entry
		}
	}
	last := j.staged.nextSeq - 1
	b := tx.Bucket(bucketIndex)
	b.FillPercent = 1 // keys only grow
	if err := putSegment(b, last, entries, bloom, open); err != nil {
		return err
	}
	j.staged.seal = &segment{last: last, n: len(entries), bloom: bloom}
	return nil
}

// apply makes the committed batch's index changes visible.
func (j *Journal) apply() {
	s := &j.staged
	x := j.idx
	x.mu.Lock()
	defer x.mu.Unlock()
	if s.seal != nil {
		x.addSegment(s.seal)
		// Emptied, not made again: it fills up to sealAt events again, and
		// a new one beside the old until the collector runs would be
		// megabytes twice.
		clear(x.tail)
	} else {
		for h, e := range s.tail {
			x.tail[h] = e
		}
	}
	for h, c := range s.open {
		if c.closed {
			delete(x.open, h)
		} else {
			x.open[h] = c.entry
		}
	}
	if s.cut > 0 {
		for h, e := range x.tail {
			if e.at.seq() < s.cut {
				delete(x.tail, h)
			}
		}
	}
	if len(s.dropped) > 0 {
		x.dropSegments(s.dropped)
	}
	if s.nextSeq > j.nextSeq {
		j.nextSeq = s.nextSeq
	}
}

// appendTime appends t as big-endian Unix nanoseconds, which sort by time.
func appendTime(dst []byte, t time.Time) []byte {
	return binary.BigEndian.AppendUint64(dst, uint64(t.UnixNano()))
}
