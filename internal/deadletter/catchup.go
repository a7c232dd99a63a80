package deadletter

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"handoff.dev/handoff/internal/broker"
)

// catchUpBatch is how many log messages one index transaction takes: the
// offsets read are stored with what they brought, so a crash resumes at the
// last batch stored.
const catchUpBatch = 500

// Caught is what one catch-up did.
type Caught struct {
	// Letters counts new DLQ entries indexed.
	Letters int
	// Records counts ledger records applied.
	Records int
	// Refused counts ledger records not applied: illegal in the ledger's
	// order (a concurrent transition came first), or naming no dead letter.
	Refused int
	// Skipped counts ledger records of a newer version or kind.
	Skipped int
	// Expired counts open dead letters that retention removed.
	Expired int
	// Unseen counts DLQ entries that retention removed before this index
	// read them.
	Unseen int64
}

// CatchUp reads src's DLQ and then its ledger from the offsets the index
// stored to their ends, and marks expired the open dead letters that the
// DLQ's retention removed. The DLQ is read first: a ledger record names a
// DLQ entry written before it, so reading in this order finds the entry of
// every record read, but for one appended between the two reads.
func (x *Index) CatchUp(ctx context.Context, src Source) (Caught, error) {
	x.catchUp.Lock()
	defer x.catchUp.Unlock()
	var c Caught
	first, err := src.DLQ.First(ctx)
	if err != nil {
		return c, fmt.Errorf("first offsets of %s: %w", src.DLQ.Name(), err)
	}
	if err := x.readDLQ(ctx, src, first, &c); err != nil {
		return c, err
	}
	if err := x.readLedger(ctx, src, &c); err != nil {
		return c, err
	}
	if err := x.expire(src, first, &c); err != nil {
		return c, err
	}
	return c, nil
}

// catchUpLedger reads src's ledger alone.
func (x *Index) catchUpLedger(ctx context.Context, src Source) error {
	x.catchUp.Lock()
	defer x.catchUp.Unlock()
	return x.readLedger(ctx, src, &Caught{})
}

type logEntry struct {
	partition int32
	offset    int64
	at        time.Time
	msg       *broker.Message
}

// readLog reads log from the stored offsets in batches, calling apply for
// each entry not stored yet within the batch's transaction, and storing the
// next offsets with it.
func (x *Index) readLog(ctx context.Context, log Log, from map[int32]int64, apply func(tx *bolt.Tx, e *logEntry) error) error {
	var batch []logEntry
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := x.db.Update(func(tx *bolt.Tx) error {
			for i := range batch {
				e := &batch[i]
				if next, ok := nextOffset(tx, log.Name(), e.partition); ok && e.offset < next {
					continue // already applied
				}
				if err := apply(tx, e); err != nil {
					return err
				}
				if err := setNextOffset(tx, log.Name(), e.partition, e.offset+1); err != nil {
					return err
				}
			}
			return nil
		})
		batch = batch[:0]
		return err
	}
	err := log.Read(ctx, from, func(p int32, off int64, at time.Time, m *broker.Message) error {
		batch = append(batch, logEntry{partition: p, offset: off, at: at, msg: m})
		if len(batch) >= catchUpBatch {
			return flush()
		}
		return nil
	})
	if ferr := flush(); err == nil {
		err = ferr
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", log.Name(), err)
	}
	return nil
}

func (x *Index) readDLQ(ctx context.Context, src Source, first map[int32]int64, c *Caught) error {
	from, err := x.Offsets(src.DLQ.Name())
	if err != nil {
		return err
	}
	for p, next := range from {
		if f, ok := first[p]; ok && next < f {
			c.Unseen += f - next
			x.log.Warn("dead letters removed by retention before this replica indexed them",
				"log", src.DLQ.Name(), "partition", p, "count", f-next)
		}
	}
	return x.readLog(ctx, src.DLQ, from, func(tx *bolt.Tx, e *logEntry) error {
		id := ID{Log: src.DLQ.Name(), Partition: e.partition, Offset: e.offset}
		old, ok, err := getLetter(tx, id)
		if err != nil {
			return err
		}
		l := old
		if !ok {
			l = Letter{ID: id, Source: src.Name, State: Pending}
			c.Letters++
		}
		if e.at.IsZero() {
			// A RabbitMQ stream tells an AMQP 0.9.1 reader no time of its own.
			e.at = x.now()
		}
		l.fill(e.at, e.msg)
		if !ok {
			return putLetter(tx, nil, &l)
		}
		return putLetter(tx, &old, &l)
	})
}

func (x *Index) readLedger(ctx context.Context, src Source, c *Caught) error {
	from, err := x.Offsets(src.Ledger.Name())
	if err != nil {
		return err
	}
	return x.readLog(ctx, src.Ledger, from, func(tx *bolt.Tx, e *logEntry) error {
		r, err := DecodeRecord(e.msg.Body)
		switch {
		case errors.Is(err, ErrVersion) || errors.Is(err, ErrUnknownKind):
			c.Skipped++
			return nil
		case err != nil:
			c.Refused++
			x.log.Warn("unreadable ledger record skipped", "log", src.Ledger.Name(), "offset", e.offset, "err", err)
			return nil
		}
		id, _ := ParseID(r.ID) // checked by DecodeRecord
		if id.Log != src.DLQ.Name() {
			c.Refused++
			x.log.Warn("ledger record for another log skipped", "log", src.Ledger.Name(), "offset", e.offset, "id", r.ID)
			return nil
		}
		old, ok, err := getLetter(tx, id)
		if err != nil {
			return err
		}
		l := old
		if !ok {
			// The DLQ entry was not read yet, or was removed before this
			// index read it: the state is kept until it is.
			l = Letter{ID: id, Source: src.Name, State: Pending}
		}
		to, err := Decide(l.State, r.Transition)
		if err != nil {
			c.Refused++
			x.log.Info("ledger record refused in the ledger's order", "id", r.ID, "offset", e.offset, "err", err)
			return nil
		}
		l.State = to
		l.History = append(l.History, r)
		c.Records++
		if !ok {
			return putLetter(tx, nil, &l)
		}
		return putLetter(tx, &old, &l)
	})
}

// expire closes the open dead letters below the DLQ's first offsets.
func (x *Index) expire(src Source, first map[int32]int64, c *Caught) error {
	now := x.now().UTC()
	return x.db.Update(func(tx *bolt.Tx) error {
		for p, f := range first {
			prefix := partitionPrefix(src.DLQ.Name(), p)
			end := ID{Log: src.DLQ.Name(), Partition: p, Offset: f}.key()
			var expired []Letter
			cur := tx.Bucket(bucketLetters).Cursor()
			for k, _ := cur.Seek(prefix); k != nil && string(k) < string(end); k, _ = cur.Next() {
				id, ok := idFromKey(k)
				if !ok {
					continue
				}
				l, _, err := getLetter(tx, id)
				if err != nil {
					return err
				}
				if l.Open() {
					expired = append(expired, l)
				}
			}
			for _, old := range expired {
				l := old
				l.State = Expired
				l.History = append(append([]Record(nil), l.History...), Record{
					Version: RecordVersion, Kind: KindTransition, ID: l.ID.String(),
					Transition: Expire, State: Expired, Who: "retention", At: now,
				})
				if err := putLetter(tx, &old, &l); err != nil {
					return err
				}
				c.Expired++
				x.log.Warn("dead letter expired: retention removed it before it was closed",
					"id", l.ID.String(), "state", old.State, "event_id", l.EventID, "reason", l.Reason)
			}
		}
		return nil
	})
}
