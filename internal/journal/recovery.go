package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
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
}

func (r Recovery) String() string {
	return fmt.Sprintf("%d open: %d received, %d in a call, %d handled not acked, %d copy unconfirmed, %d copy confirmed not acked, %d failed without a copy",
		r.Open, r.Received, r.InCall, r.Handled, r.Unconfirmed, r.Confirmed, r.Failed)
}

// outcomeSuccess and outcomeDrop are budget.Success and budget.Drop; the
// journal stores outcomes as numbers and only needs to know these two.
const (
	outcomeSuccess = 1
	outcomeDrop    = 7
)

// Handled reports whether the hop's attempt succeeded or was dropped.
func (s *State) Handled() bool {
	return s.HopAttempt > 0 && (s.HopOutcome == outcomeSuccess || s.HopOutcome == outcomeDrop)
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

// verify prepares the buckets, checks the file's structure and every open
// hand-off's records, and counts what was left open.
func (j *Journal) verify() (Recovery, error) {
	var rec Recovery
	// Read everything before writing anything: a damaged file is reported
	// as it was found.
	if err := j.check(); err != nil {
		return rec, err
	}
	// A journal with everything in place is only read; a new file gets its
	// buckets. Opening never writes to a journal it has not understood.
	fresh, format := false, uint32(0)
	err := j.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			// Empty is a new journal; anything else is somebody else's file.
			if k, _ := tx.Cursor().First(); k != nil {
				return errors.New("not a journal: no meta bucket")
			}
			fresh = true
			return nil
		}
		v := meta.Get(metaFormat)
		if len(v) == 4 {
			format = binary.BigEndian.Uint32(v)
		}
		var names [][]byte
		switch {
		case len(v) == 4 && format == formatVersion:
			names = [][]byte{bucketIDs, bucketRecords, bucketPending, bucketExpiry}
		case len(v) == 4 && format == 1:
			names = [][]byte{bucketSteps, bucketOpen, bucketSettled}
		default:
			return fmt.Errorf("journal format %x, this build reads formats 1 and %d", v, formatVersion)
		}
		for _, b := range names {
			if tx.Bucket(b) == nil {
				return fmt.Errorf("not a journal: bucket %q missing", b)
			}
		}
		return nil
	})
	if err != nil {
		return rec, err
	}
	switch {
	case fresh && j.o.ReadOnly:
		return rec, errors.New("not a journal: no meta bucket")
	case fresh:
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
	case format == 1 && j.o.ReadOnly:
		return rec, errors.New("journal format 1: a sidecar of this version upgrades it when it starts")
	case format == 1:
		err = j.upgrade()
	}
	if err != nil {
		return rec, err
	}
	err = j.db.View(func(tx *bolt.Tx) error {
		b := j.buckets(tx)
		return b.pending.ForEach(func(id, _ []byte) error {
			if len(id) != idLen {
				return fmt.Errorf("%w: pending key of %d bytes", ErrCorrupt, len(id))
			}
			s, err := b.state(id)
			if err != nil {
				return fmt.Errorf("hand-off %x: %w", id, err)
			}
			rec.add(s)
			return nil
		})
	})
	return rec, err
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
	for _, b := range [][]byte{bucketIDs, bucketRecords, bucketPending, bucketExpiry} {
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
