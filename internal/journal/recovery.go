package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"

	"handoff.dev/handoff/internal/budget"
)

// Recovery is what Open found that a previous run left open: hand-offs whose
// delivery was never settled, by the phase they stopped in. Each resumes from
// there when the broker redelivers its message.
type Recovery struct {
	Open int
	// Received: taken, no attempt recorded.
	Received int
	// InCall: an attempt started and never ended (the process stopped during
	// the call); its outcome is unknown.
	InCall int
	// Handled: the app succeeded; the ack may not have reached the broker.
	Handled int
	// Unconfirmed: a copy was being published, its confirm not recorded; it
	// is published again.
	Unconfirmed int
	// Confirmed: the copy was confirmed; the source ack may be missing.
	Confirmed int
	// Failed: an attempt failed and no copy was started.
	Failed int
	// Unreadable: parts of the log that fail their checksum, whose
	// hand-offs may or may not be open. Each such hand-off is handled as
	// new when its message comes back: at worst a duplicate call, never a
	// lost message. `sidecar journal repair` drops them.
	Unreadable int
}

func (r Recovery) String() string {
	s := fmt.Sprintf("%d open: %d received, %d in a call, %d handled not acked, %d copy unconfirmed, %d copy confirmed not acked, %d failed without a copy",
		r.Open, r.Received, r.InCall, r.Handled, r.Unconfirmed, r.Confirmed, r.Failed)
	if r.Unreadable > 0 {
		s += fmt.Sprintf("; %d unreadable parts", r.Unreadable)
	}
	return s
}

// Handled reports whether the hop's attempt succeeded or was dropped.
func (s *State) Handled() bool {
	return s.HopAttempt > 0 && (budget.Outcome(s.HopOutcome) == budget.Success || budget.Outcome(s.HopOutcome) == budget.Drop)
}

// safeVerify is verify, with bbolt's panics on damaged pages turned into
// errors: a journal that cannot be read is a startup error, not a crash.
func (j *Journal) safeVerify() (rec Recovery, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("damaged page: %v", r)
		}
	}()
	return j.verify()
}

// verify prepares the buckets, checks the file's structure, loads the index
// and counts what was left open.
func (j *Journal) verify() (Recovery, error) {
	// Read everything before writing anything: a damaged file is reported
	// as it was found.
	if err := j.check(); err != nil {
		return Recovery{}, err
	}
	// A journal with everything in place is only read; a new file gets its
	// buckets. Opening never writes to a journal it has not understood.
	format, err := readFormat(j.db)
	if err != nil {
		return Recovery{}, err
	}
	switch {
	case format == 0 && j.o.ReadOnly:
		return Recovery{}, errors.New("not a journal: no meta bucket")
	case format == 0:
		err = j.db.Update(func(tx *bolt.Tx) error {
			meta, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			if err := meta.Put(metaFormat, binary.BigEndian.AppendUint32(nil, formatVersion)); err != nil {
				return err
			}
			return createBuckets(tx)
		})
	case format != formatVersion:
		// Open upgrades a writable journal before it verifies it.
		return Recovery{}, fmt.Errorf("journal format %d: a sidecar of this version upgrades it when it starts", format)
	}
	if err != nil {
		return Recovery{}, err
	}
	return j.load()
}

// readFormat is the journal's format: 0 for an empty file.
func readFormat(db *bolt.DB) (uint32, error) {
	var format uint32
	err := db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			// Empty is a new journal; anything else is somebody else's file.
			if k, _ := tx.Cursor().First(); k != nil {
				return errors.New("not a journal: no meta bucket")
			}
			return nil
		}
		v := meta.Get(metaFormat)
		if len(v) == 4 {
			format = binary.BigEndian.Uint32(v)
		}
		var names [][]byte
		switch {
		case len(v) == 4 && format == formatVersion:
			names = [][]byte{bucketLog, bucketIndex}
		case len(v) == 4 && format == 2:
			names = [][]byte{bucketIDs, bucketRecords, bucketPending, bucketExpiry}
		case len(v) == 4 && format == 1:
			names = [][]byte{bucketSteps, bucketOpen, bucketSettled}
		default:
			return fmt.Errorf("journal format %x, this build reads formats 1 to %d", v, formatVersion)
		}
		for _, b := range names {
			if tx.Bucket(b) == nil {
				return fmt.Errorf("not a journal: bucket %q missing", b)
			}
		}
		return nil
	})
	return format, err
}

// load reads the index's segments and the tail of the log written after
// the newest one, then counts the hand-offs left open.
func (j *Journal) load() (Recovery, error) {
	x := j.idx
	var rec Recovery
	err := j.db.View(func(tx *bolt.Tx) error {
		// The segments' last numbers, then each one's filter; the
		// newest one's open set is the open set as it sealed.
		var lasts []uint64
		c := tx.Bucket(bucketIndex).Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Seek(segKey(binary.BigEndian.Uint64(k)+1, segHeader, 0)) {
			if len(k) != 17 {
				return fmt.Errorf("%w: index key of %d bytes", ErrCorrupt, len(k))
			}
			lasts = append(lasts, binary.BigEndian.Uint64(k))
		}
		for i, last := range lasts {
			var open func(uint64, openEntry)
			if i == len(lasts)-1 {
				open = func(h uint64, o openEntry) { x.open[h] = o }
			}
			g, err := readSegment(c, last, open)
			if err != nil {
				return err
			}
			x.addSegment(g)
		}
		from := uint64(1)
		if len(x.segs) > 0 {
			from = x.segs[len(x.segs)-1].last + 1
		}
		j.nextSeq = from
		if k, _ := tx.Bucket(bucketLog).Cursor().Last(); len(k) == 8 {
			j.nextSeq = max(j.nextSeq, binary.BigEndian.Uint64(k)+1)
		}
		if err := j.loadTail(tx, from, &rec); err != nil {
			return err
		}
		return j.countOpen(tx, &rec)
	})
	return rec, err
}

// loadTail indexes the parts from sequence number from on.
func (j *Journal) loadTail(tx *bolt.Tx, from uint64, rec *Recovery) error {
	x := j.idx
	hashes := map[ref]uint64{} // of the tail's parts, for the links to them
	c := tx.Bucket(bucketLog).Cursor()
	for k, v := c.Seek(binary.BigEndian.AppendUint64(nil, from)); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return fmt.Errorf("%w: log key of %d bytes", ErrCorrupt, len(k))
		}
		seq := binary.BigEndian.Uint64(k)
		base, err := valueBase(v)
		if err != nil {
			return err
		}
		// A part that cannot be read is counted and left out: its
		// hand-off's state cannot be read either, and dispatch handles its
		// message as new (at worst a duplicate call).
		var ferr error
		partsOf(v, func(off int, body []byte, perr error) bool {
			if body == nil {
				j.log.Warn("journal: a damaged log value is read only up to here", "seq", seq, "offset", off, "err", perr)
				rec.Unreadable++
				return false
			}
			head, recs, err := readHead(body, seq)
			at := makeRef(seq, off)
			if err != nil || perr != nil {
				j.log.Warn("journal: a part of the log cannot be read", "seq", seq, "offset", off, "err", errors.Join(perr, err))
				rec.Unreadable++
				if err != nil {
					return true
				}
				recs = nil // indexed, so its hand-off's history shows it
			}
			var h uint64
			var check uint32
			switch {
			case head.flags&flagKey != 0:
				h, check = eventHash(head.key), keyCheck(head.key)
			default:
				check = head.check
				var ok bool
				if h, ok = hashes[head.prev]; !ok {
					if h, ok = chainHash(tx, head.prev); !ok {
						return true // a chain whose named parts were dropped
					}
				}
			}
			hashes[at] = h
			x.tail[h] = tailEntry{at: at, check: check}
			if recs == nil {
				return true
			}
			rs, err := readRecords(recs, base, nil)
			if err != nil {
				ferr = err
				return false
			}
			cur, ok := x.open[h]
			if cur, ok = openStep(cur, ok, rs); ok {
				cur.at = at
				x.open[h] = cur
			} else {
				delete(x.open, h)
			}
			return true
		})
		if ferr != nil {
			return ferr
		}
	}
	return nil
}

// chainHash is the event hash of the chain r is in, from the first part
// on it that names its key in full.
func chainHash(tx *bolt.Tx, r ref) (uint64, bool) {
	var h uint64
	var ok bool
	_ = walkFrom(tx, r, func(_ ref, head *partHead, _ []byte, _ int64) (bool, error) {
		if head.flags&flagKey != 0 {
			h, ok = eventHash(head.key), true
			return false, nil
		}
		return true, nil
	})
	return h, ok
}

// countOpen counts the open hand-offs by the phase they stopped in, and
// drops from the open set the events none of whose hand-offs is open.
func (j *Journal) countOpen(tx *bolt.Tx, rec *Recovery) error {
	for h := range j.idx.open {
		n := 0
		r, err := j.idx.resolve(tx, h)
		if err != nil {
			return err
		}
		err = j.eachHandoffFrom(tx, r, func(k Key, recs []Record, _ ref) {
			var s State
			var t openTrack
			for i := range recs {
				s.apply(recs[i])
				t.apply(&recs[i])
			}
			if t.open {
				rec.add(s)
				n++
			}
		})
		if errors.Is(err, ErrCorrupt) {
			// Kept open: a restart needs to know what it can.
			j.log.Warn("journal: an open hand-off's history cannot be read", "err", err)
			rec.Unreadable++
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			delete(j.idx.open, h)
		}
	}
	return nil
}

// eachHandoffFrom calls fn with the records of each hand-off of the event
// whose newest part is r, oldest first, and the ref of its oldest part.
func (j *Journal) eachHandoffFrom(tx *bolt.Tx, r ref, fn func(Key, []Record, ref)) error {
	order, byKey, err := handoffsFrom(tx, r)
	if err != nil {
		return err
	}
	for _, k := range order {
		ps := byKey[k]
		var recs []Record
		for i := len(ps) - 1; i >= 0; i-- {
			if recs, err = readRecords(ps[i].recs, ps[i].base, recs); err != nil {
				return err
			}
		}
		fn(k, recs, ps[len(ps)-1].at)
	}
	return nil
}

// add counts one open hand-off by the phase it stopped in.
func (r *Recovery) add(s State) {
	r.Open++
	switch {
	case s.Copy != nil && s.Copy.Hop > s.Hop && s.Copy.Confirmed:
		r.Confirmed++
	case s.Copy != nil && s.Copy.Hop > s.Hop:
		r.Unconfirmed++
	case s.Handled():
		r.Handled++
	case s.HopAttempt > 0 && s.HopOutcome == 0:
		r.InCall++
	case s.HopAttempt > 0:
		r.Failed++
	default:
		r.Received++
	}
}

// createBuckets creates the buckets of the current format.
func createBuckets(tx *bolt.Tx) error {
	for _, b := range [][]byte{bucketLog, bucketIndex} {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return err
		}
	}
	return nil
}

// check reads every key and value of every bucket, so that each page of the
// file is touched once here, in this goroutine, where a damaged page is a
// recoverable panic (bbolt's own Check runs in a goroutine of its own, where
// it would not be).
func (j *Journal) check() error {
	return j.db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			return walk(b, 0)
		})
	})
}

func walk(b *bolt.Bucket, depth int) error {
	if depth > 8 {
		return fmt.Errorf("%w: buckets nested too deep", ErrCorrupt)
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				if err := walk(nb, depth+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
