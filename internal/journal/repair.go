package journal

import (
	"bytes"
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
	// Kept and Lost count the records copied into the new journal and those
	// that could not be read.
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
	var items []item
	keep := func(key []byte, rec Record) { items = append(items, item{key: key, rec: rec}) }
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
			// Both, in a journal whose upgrade stopped part way.
			records, steps := tx.Bucket(bucketRecords), tx.Bucket(bucketSteps)
			if records == nil && steps == nil {
				return errors.New("no records bucket")
			}
			if records != nil {
				if err := salvageRecords(records, &rep, keep); err != nil {
					return err
				}
			}
			if steps != nil {
				return salvageSteps(steps, &rep, keep)
			}
			return nil
		})
	}
	rep.Stopped = salvage()

	j, _, err := Open(path, Options{Sync: SyncAlways})
	if err != nil {
		return rep, fmt.Errorf("create the new journal: %w", err)
	}
	if err := j.keepInstanceID(readInstanceID(aside)); err != nil {
		_ = j.Close()
		return rep, err
	}
	const chunk = 1024
	for i := 0; i < len(items); i += chunk {
		var batch []*request
		for _, it := range items[i:min(i+chunk, len(items))] {
			batch = append(batch, &request{key: it.key, recs: []Record{it.rec}})
		}
		if err := j.commit(batch); err != nil {
			_ = j.Close()
			return rep, fmt.Errorf("write the new journal: %w", err)
		}
		rep.Kept += len(batch)
	}
	return rep, j.Close()
}

type item struct {
	key []byte // encoded
	rec Record
}

// salvageRecords reads the records of a current-format journal. A record
// whose hand-off key cannot be read is lost with it.
func salvageRecords(b *bolt.Bucket, rep *RepairReport, keep func([]byte, Record)) error {
	var id, key []byte
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 2*idLen {
			rep.Lost++
			continue
		}
		if binary.BigEndian.Uint64(k[idLen:]) == 0 {
			id, key = append(id[:0], k[:idLen]...), nil
			if _, rest, err := decodeKey(v); err != nil || len(rest) != 0 {
				rep.Lost++
				continue
			}
			key = append([]byte(nil), v...)
			continue
		}
		rec, err := Decode(v)
		if err != nil || key == nil || !bytes.Equal(k[:idLen], id) {
			rep.Lost++
			continue
		}
		keep(key, rec)
	}
	return nil
}

// salvageSteps reads the records of a format 1 journal.
func salvageSteps(b *bolt.Bucket, rep *RepairReport, keep func([]byte, Record)) error {
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		rec, err := Decode(v)
		if err != nil || len(k) < 8 {
			rep.Lost++
			continue
		}
		if _, rest, err := decodeKey(k[:len(k)-8]); err != nil || len(rest) != 0 {
			rep.Lost++
			continue
		}
		keep(append([]byte(nil), k[:len(k)-8]...), rec)
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
