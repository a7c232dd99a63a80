package journal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// RepairReport says what Repair kept.
type RepairReport struct {
	// Aside is where the damaged file was moved.
	Aside string
	// Kept counts the records copied into the new journal; Lost the parts
	// that could not be read (a part is a hand-off's records of one
	// commit; in a journal of an earlier format, one record).
	Kept, Lost int
	// Stopped says why reading stopped early, when it did: the records past
	// that point are lost too.
	Stopped error
}

// Repair moves a damaged journal aside and writes a new one at path with
// every record that can still be read. Hand-offs whose records were lost are
// handled as new when their messages come back: at worst a duplicate call,
// never a lost message. The new journal keeps the old one's instance id when
// it can be read.
func Repair(path string) (RepairReport, error) {
	aside, err := moveAside(path, "corrupt")
	if err != nil {
		return RepairReport{}, err
	}
	rep := RepairReport{Aside: aside}
	type handoff struct {
		k    Key
		recs []Record
	}
	var items []handoff
	var marks map[string]int64
	keep := func(k Key, recs []Record) { items = append(items, handoff{k, recs}) }
	salvage := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("stopped reading at a damaged page: %v", r)
			}
		}()
		db, err := bolt.Open(aside, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			return err
		}
		defer db.Close()
		return db.View(func(tx *bolt.Tx) error {
			if meta := tx.Bucket(bucketMeta); meta != nil {
				marks = readMarks(meta)
			}
			if tx.Bucket(bucketLog) != nil {
				return salvageLog(tx, &rep, keep)
			}
			return salvageOld(tx, &rep, keep)
		})
	}
	rep.Stopped = salvage()

	j, _, err := Open(path, Options{Sync: SyncBatch, MaxSize: -1, AsyncDelay: -1})
	if err != nil {
		return rep, fmt.Errorf("create the new journal: %w", err)
	}
	if err := j.keepInstanceID(readInstanceID(aside)); err != nil {
		_ = j.Close()
		return rep, err
	}
	for _, it := range items {
		j.AppendAsync(it.k, it.recs...)
		rep.Kept += len(it.recs)
	}
	if err := j.SetMarks(context.Background(), marks); err != nil {
		_ = j.Close()
		return rep, fmt.Errorf("write the new journal: %w", err)
	}
	if err := j.Close(); err != nil {
		return rep, fmt.Errorf("write the new journal: %w", err)
	}
	return rep, nil
}

// salvageLog reads the hand-offs of a current-format journal, part by part:
// a part that cannot be read is lost; past one whose length is wrong, the
// rest of its value too (a part's length is what finds the next one).
func salvageLog(tx *bolt.Tx, rep *RepairReport, fn func(Key, []Record)) error {
	keys := map[uint32]Key{}
	var order []Key
	byKey := map[Key][]Record{}
	c := tx.Bucket(bucketLog).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		base, err := valueBase(v)
		if err != nil || len(k) != 8 {
			rep.Lost++
			continue
		}
		seq := binary.BigEndian.Uint64(k)
		partsOf(v, func(_ int, body []byte, err error) bool {
			if err != nil {
				rep.Lost++
				return true // past a failed checksum, on by its length
			}
			head, p, err := readHead(body, seq)
			if err != nil {
				rep.Lost++
				return true
			}
			key, ok := head.key, head.flags&flagKey != 0
			if ok {
				keys[keyCheck(key)] = key
			} else if key, ok = keys[head.check]; !ok {
				rep.Lost++ // its hand-off's first part was dropped before
				return true
			}
			recs, err := readRecords(p, base, nil)
			if err != nil {
				rep.Lost++
				return true
			}
			old, seen := byKey[key]
			if !seen {
				order = append(order, key)
			}
			if head.flags&flagCopy != 0 {
				old = old[:0]
			}
			byKey[key] = append(old, recs...)
			return true
		})
	}
	for _, k := range order {
		if len(byKey[k]) > 0 {
			fn(k, byKey[k])
		}
	}
	return nil
}

// Reset moves the journal aside and starts an empty one at path, keeping the
// old file's instance id when it can be read. It returns where the old file
// went.
func Reset(path string) (string, error) {
	aside, err := moveAside(path, "reset")
	if err != nil {
		return "", err
	}
	j, _, err := Open(path, Options{})
	if err != nil {
		return aside, fmt.Errorf("create the new journal: %w", err)
	}
	if err := j.keepInstanceID(readInstanceID(aside)); err != nil {
		_ = j.Close()
		return aside, err
	}
	return aside, j.Close()
}

// moveAside renames path to path.<why>-<time>; it never deletes a journal.
func moveAside(path, why string) (string, error) {
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("journal %s: %w", path, err)
	}
	if err := ensureUnlocked(path); err != nil {
		return "", err
	}
	aside := fmt.Sprintf("%s.%s-%s", path, why, time.Now().UTC().Format("20060102T150405.000Z"))
	if err := os.Rename(path, aside); err != nil {
		return "", fmt.Errorf("move %s aside: %w", path, err)
	}
	return aside, nil
}

// ensureUnlocked fails when a running sidecar holds the journal: moving a
// journal aside under it would lose what it writes next.
func ensureUnlocked(path string) (err error) {
	defer func() {
		if recover() != nil {
			err = nil // damaged beyond opening, but not locked
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if errors.Is(err, berrors.ErrTimeout) {
		return fmt.Errorf("%w: %s (stop the sidecar first)", ErrLocked, path)
	}
	if err == nil {
		_ = db.Close()
	}
	return nil
}
