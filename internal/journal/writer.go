package journal

import (
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The writer: one goroutine that gathers the queued requests into group
// commits.

// writer is the one goroutine that writes: it gathers queued requests into a
// batch, commits it in one transaction, and answers every waiter. After a
// failed commit it commits nothing more: a record must never land without
// the ones queued before it.
func (j *Journal) writer() {
	defer j.wg.Done()
	defer j.thens.close()
	batch := make([]*request, 0, 64)
	var calls []thenCall
	var next *request // taken from the queue but left for the next batch
	for {
		first := next
		next = nil
		if first == nil {
			var ok bool
			if first, ok = <-j.reqs; !ok {
				return
			}
		}
		batch = append(batch[:0], first)
		if first.drop != nil {
			// Alone: it reads the index as the last commit left it.
		} else if j.o.Sync == SyncAlways {
			batch, next = j.gatherAsync(batch, len(first.recs))
		} else {
			batch, next = j.gather(batch, len(first.recs))
		}
		j.lastBatch = len(batch)
		err := j.failure()
		if err == nil {
			start := time.Now()
			err = j.commit(batch)
			took := time.Since(start)
			j.commits.record(took)
			if j.o.OnCommit != nil {
				j.o.OnCommit(took)
			}
			if err == nil && j.overSize() {
				select {
				case j.trimNow <- struct{}{}:
				default:
				}
			}
			switch {
			case err != nil && noRoom(err):
				// Nothing of the batch landed: its waiters hear so, and
				// the next batch is tried, not refused.
				err = fmt.Errorf("%w: %s: %w", ErrNoRoom, j.path, err)
				j.failMu.Lock()
				if j.full == nil {
					j.log.Error("journal cannot be written: no room; hand-offs wait until it can", "path", j.path, "err", err)
				}
				j.full = err
				j.failMu.Unlock()
			case err != nil:
				j.failMu.Lock()
				if j.failed == nil {
					j.failed = fmt.Errorf("journal %s: commit failed: %w", j.path, err)
					j.log.Error("journal commit failed; the journal accepts no more records", "path", j.path, "err", err)
				}
				err = j.failed
				j.failMu.Unlock()
			default:
				j.failMu.Lock()
				if j.full != nil {
					j.log.Info("journal writable again", "path", j.path)
					j.full = nil
				}
				j.failMu.Unlock()
			}
		}
		for _, r := range batch {
			switch {
			case r.wait != nil:
				r.wait <- err // its caller frees it, if pooled
			case r.then != nil:
				calls = append(calls, thenCall{r.then, err})
				r.free()
			default:
				r.free()
			}
		}
		if len(calls) > 0 {
			j.thens.push(calls)
			clear(calls)
			calls = calls[:0]
		}
	}
}

// lingerAfter is how many requests the latest commit must have held for
// the next one to linger: with fewer, writers are not many at once, and a
// wait would only delay them (a partition handled one record at a time
// waits out a commit per record).
const lingerAfter = 8

// gather adds queued requests to batch while they fit in MaxBatch records,
// waiting up to Linger for more when the queue runs dry and the latest
// commit was a busy one. A request that does not fit is returned, for the
// next batch; one larger than MaxBatch on its own is a batch by itself.
func (j *Journal) gather(batch []*request, n int) ([]*request, *request) {
	var linger <-chan time.Time
	waited := false
	for _, r := range batch {
		waited = waited || r.waited()
	}
	for n < j.o.MaxBatch {
		var r *request
		var ok bool
		select {
		case r, ok = <-j.reqs:
		default:
			wait := j.o.Linger
			if !waited {
				wait = j.o.AsyncDelay
			} else if j.lastBatch < lingerAfter {
				wait = 0
			}
			if wait <= 0 {
				return batch, nil
			}
			if linger == nil {
				linger = time.After(wait)
			}
			select {
			case r, ok = <-j.reqs:
			case <-linger:
				return batch, nil
			}
		}
		if !ok {
			return batch, nil
		}
		if n+len(r.recs) > j.o.MaxBatch || r.drop != nil {
			return batch, r
		}
		batch = append(batch, r)
		n += len(r.recs)
		if r.waited() && !waited {
			// Somebody waits now: from here on this is a batch like any,
			// which takes what is queued and lingers only after a busy one.
			waited, linger = true, nil
		}
	}
	return batch, nil
}

// waited reports whether somebody waits for r's commit: Append's caller, or
// AppendThen's callback.
func (r *request) waited() bool { return r.wait != nil || r.then != nil }

// defaultAsyncDelay is Options.AsyncDelay when it is zero.
const defaultAsyncDelay = 5 * time.Millisecond

// gatherAsync is gather for SyncAlways: every Append still commits on its
// own, but queued records nobody waits for (AppendAsync) ride along with the
// next transaction instead of costing an fsync each.
func (j *Journal) gatherAsync(batch []*request, n int) ([]*request, *request) {
	if batch[len(batch)-1].waited() {
		return batch, nil // a waited request closes the transaction
	}
	for n < j.o.MaxBatch {
		var r *request
		var ok bool
		select {
		case r, ok = <-j.reqs:
		default:
			return batch, nil
		}
		if !ok {
			return batch, nil
		}
		if n+len(r.recs) > j.o.MaxBatch || r.drop != nil {
			return batch, r
		}
		batch = append(batch, r)
		n += len(r.recs)
		if r.waited() {
			return batch, nil
		}
	}
	return batch, nil
}

func (j *Journal) commit(batch []*request) error {
	j.staged.reset()
	err := j.db.Update(func(tx *bolt.Tx) error {
		n, err := j.write(tx, batch)
		if err != nil {
			return err
		}
		if j.o.BeforeCommit != nil {
			return j.o.BeforeCommit(n)
		}
		return nil
	})
	if err == nil {
		j.apply()
	}
	return err
}

// write puts the batch's records in tx and returns how many it wrote.
func (j *Journal) write(tx *bolt.Tx, batch []*request) (int, error) {
	w := j.logWriter(tx)
	js := &j.joins
	js.find(batch)
	n := 0
	for i, r := range batch {
		switch {
		case r.probe:
			// A page written and synced like any record's.
			if err := tx.Bucket(bucketMeta).Put(metaProbe, appendTime(nil, w.now)); err != nil {
				return n, err
			}
		case r.marks != nil:
			if err := putMarks(tx, r.marks); err != nil {
				return n, err
			}
		case r.drop != nil:
			if err := j.drop(tx, &w, r.drop); err != nil {
				return n, err
			}
		case len(r.recs) > 0:
			if js.joined[i] {
				continue // written with the first of its hand-off's
			}
			recs := r.recs
			if js.next[i] != 0 {
				recs = append(js.recs[:0], recs...)
				for k := js.next[i]; k != 0; k = js.next[k] {
					recs = append(recs, batch[k].recs...)
				}
				js.recs = recs
			}
			if err := w.part(r.key, recs, 0); err != nil {
				return n, err
			}
			n += len(recs)
		}
	}
	if err := w.flush(); err != nil {
		return n, err
	}
	return n, j.maybeSeal(tx)
}

// joins says which requests of a batch hold records of one hand-off: their
// records go in one part, at the first one's place in the log, in the order
// they were queued. The transaction lands all of them or none, so nothing a
// crash could leave changes; one part costs less than several, on disk and
// to write. A hand-off's OUTCOME and a RELEASED or TRANSFERRING queued
// soon after it, say, are often in one batch.
type joins struct {
	latest map[Key]int // the latest request of each hand-off so far
	size   []int       // the size of the records joined up to each request
	next   []int       // the index of the next request of the same hand-off, or 0
	joined []bool      // written with an earlier request of its hand-off
	recs   []Record    // the joined records of a part being written
}

// maxJoin bounds the records joined in one part, well under a value's
// bound (maxValue): records with large details stay parts of their own.
const maxJoin = 1 << 20

// find fills next and joined for batch.
func (js *joins) find(batch []*request) {
	if js.latest == nil {
		js.latest = make(map[Key]int)
	}
	clear(js.latest)
	js.size = grown(js.size, len(batch))
	js.next = grown(js.next, len(batch))
	js.joined = grown(js.joined, len(batch))
	for i, r := range batch {
		if len(r.recs) == 0 || r.drop != nil || r.marks != nil || r.probe {
			continue
		}
		size := recordsSize(r.recs)
		js.size[i] = size
		last, ok := js.latest[r.key]
		if ok && js.size[last]+size <= maxJoin {
			js.next[last] = i
			js.joined[i] = true
			js.size[i] += js.size[last] // the running size travels with the latest
		}
		js.latest[r.key] = i
	}
}

// grown is s with n zero values.
func grown[T any](s []T, n int) []T {
	s = slices.Grow(s[:0], n)[:n]
	clear(s)
	return s
}

// recordsSize is about the bytes recs take in a part, at least.
func recordsSize(recs []Record) int {
	n := 0
	for i := range recs {
		r := &recs[i]
		n += 32 + len(r.Dest) + len(r.Detail) + len(r.Position)
		for k, v := range r.Trail {
			n += len(k) + len(v) + 2
		}
	}
	return n
}
