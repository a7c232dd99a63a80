package deadletter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	var c Caught
	select {
	case x.catchUp <- struct{}{}:
		defer func() { <-x.catchUp }()
	case <-ctx.Done():
		return c, ctx.Err()
	}
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

// catchUpLedger reads src's ledger alone, up to the record holding nonce
// when nonce is not empty. It does not wait for a CatchUp under way: that
// one may be waiting out a quiet stream's end (see rabbitmq.ReadStream)
// while a writer needs only its own record back. Two reads at once are
// safe: each batch applies, in its own transaction, only the entries past
// the offsets stored, so no record is applied twice.
func (x *Index) catchUpLedger(ctx context.Context, src Source, nonce string) error {
	return x.readLedgerUntil(ctx, src, nonce, &Caught{})
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
	return x.readLogUntil(ctx, log, from, "", apply)
}

// errStop ends a read early, once the record looked for was read.
var errStop = errors.New("stop")

// readLogUntil is readLog that stops after a message whose body holds
// until, when until is not empty: a writer reading its own record back
// needs nothing after it, and finding a RabbitMQ stream's end costs a quiet
// spell (see rabbitmq.ReadStream).
func (x *Index) readLogUntil(ctx context.Context, log Log, from map[int32]int64, until string, apply func(tx *bolt.Tx, e *logEntry) error) error {
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
		if until != "" && bytes.Contains(m.Body, []byte(until)) {
			return errStop
		}
		if len(batch) >= catchUpBatch {
			return flush()
		}
		return nil
	})
	if errors.Is(err, errStop) {
		err = nil
	}
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
			if err := putLetter(tx, nil, &l); err != nil {
				return err
			}
			return x.failReplay(tx, src, &l)
		}
		return putLetter(tx, &old, &l)
	})
}

// failReplay notes on the dead letter that l replayed (l is a replayed copy
// that failed again) the FailReplay that l implies, and applies it once it
// is legal. It is derived by every replica from the DLQ, like Expire, and
// never written: no replica has to survive the dead-lettering to record it.
func (x *Index) failReplay(tx *bolt.Tx, src Source, l *Letter) error {
	if l.ReplayOf == "" || l.ReplayID == "" {
		return nil
	}
	pid, err := ParseID(l.ReplayOf)
	if err != nil || pid.Log != src.DLQ.Name() || pid == l.ID {
		x.log.Warn("dead letter names a replayed dead letter that is not in its log", "id", l.ID.String(), "replay_of", l.ReplayOf)
		return nil
	}
	old, ok, err := getLetter(tx, pid)
	if err != nil {
		return err
	}
	p := old
	if !ok {
		p = Letter{ID: pid, Source: src.Name, State: Pending}
	}
	if p.Failure != nil || p.Successor != "" {
		return nil // one failure per replay: a duplicate copy of the same failure
	}
	why := "the replayed copy failed again: " + l.Reason
	if l.Error != "" {
		why += ": " + l.Error
	}
	p.Failure = &Record{Version: RecordVersion, Kind: KindTransition, ID: pid.String(), Transition: FailReplay,
		State: FailedReplay, Who: "handoff", At: l.DeadLetteredAt, Why: truncateWhy(why), ReplayID: l.ReplayID, Successor: l.ID.String()}
	applyFailure(tx, &p)
	if !ok {
		return putLetter(tx, nil, &p)
	}
	return putLetter(tx, &old, &p)
}

// applyFailure moves l to FailedReplay when it holds a failure that its
// state and the runs now allow: the run that replayed it must be known, so
// that a copy naming a dead letter it was never a replay of changes nothing.
func applyFailure(tx *bolt.Tx, l *Letter) {
	f := l.Failure
	if f == nil || tx.Bucket(bucketRuns).Get([]byte(f.ReplayID)) == nil {
		return
	}
	to, err := Decide(l.State, FailReplay)
	if err != nil {
		return
	}
	l.State, l.Successor, l.Failure = to, f.Successor, nil
	l.History = append(l.History, *f)
}

func truncateWhy(s string) string {
	if len(s) <= MaxWhyLen {
		return s
	}
	i := MaxWhyLen
	for i > 0 && s[i]&0xC0 == 0x80 {
		i-- // not inside a UTF-8 sequence
	}
	return s[:i]
}

func (x *Index) readLedger(ctx context.Context, src Source, c *Caught) error {
	return x.readLedgerUntil(ctx, src, "", c)
}

func (x *Index) readLedgerUntil(ctx context.Context, src Source, nonce string, c *Caught) error {
	from, err := x.Offsets(src.Ledger.Name())
	if err != nil {
		return err
	}
	return x.readLogUntil(ctx, src.Ledger, from, nonce, func(tx *bolt.Tx, e *logEntry) error {
		if recordKind(e.msg.Body) == KindRun {
			r, err := DecodeRunRecord(e.msg.Body)
			if err != nil {
				c.Refused++
				x.log.Warn("unreadable ledger record skipped", "log", src.Ledger.Name(), "offset", e.offset, "err", err)
				return nil
			}
			applied, err := applyRun(tx, src.Name, &r)
			if err != nil {
				return err
			}
			if applied {
				c.Records++
				return x.runApplied(tx, &r)
			}
			c.Refused++
			return nil
		}
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
		if at, late := lateReplay(&l, r.Transition, r.ReplayID); err != nil && late {
			// The runner's record of a publish whose outcome came first.
			l.History = slices.Insert(l.History, at, r)
			c.Records++
			return putLetter(tx, &old, &l)
		}
		if err != nil {
			c.Refused++
			x.log.Info("ledger record refused in the ledger's order", "id", r.ID, "offset", e.offset, "err", err)
			return nil
		}
		l.State = to
		l.History = append(l.History, r)
		applyFailure(tx, &l)
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

// recordKind is a ledger record's kind, "" when it has none.
func recordKind(b []byte) string {
	var head struct {
		Kind string `json:"kind"`
	}
	_ = json.Unmarshal(b, &head)
	return head.Kind
}

// runApplied applies, when a run is created, the failures its letters were
// waiting for: the index may have read a failed replayed copy before the
// record of the run that published it.
func (x *Index) runApplied(tx *bolt.Tx, r *RunRecord) error {
	if r.Op != OpCreate {
		return nil
	}
	for _, s := range r.Spec.IDs {
		id, err := ParseID(s)
		if err != nil {
			continue
		}
		old, ok, err := getLetter(tx, id)
		if err != nil || !ok || old.Failure == nil {
			if err != nil {
				return err
			}
			continue
		}
		l := old
		applyFailure(tx, &l)
		if err := putLetter(tx, &old, &l); err != nil {
			return err
		}
	}
	return nil
}
