package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The buckets of the earlier formats, which Open upgrades and Repair reads.
var (
	// Format 1: records keyed by key ‖ seq, the indexes by key.
	bucketSteps   = []byte("steps")   // key ‖ seq → record
	bucketOpen    = []byte("open")    // key → opened-at ‖ hop
	bucketSettled = []byte("settled") // settled-at ‖ key → nothing
	// Format 2: records keyed by hand-off id ‖ seq, the key under id ‖ 0.
	bucketIDs     = []byte("ids")
	bucketRecords = []byte("records")
	bucketPending = []byte("pending")
	bucketExpiry  = []byte("expiry")
)

// idLen is the length of a format 2 hand-off id.
const idLen = 8

// upgradeFile rewrites the journal at path, of an earlier format, in the
// current one: every hand-off's records, its instance id and its marks go
// into a new file beside it, which then takes the journal's place. The old
// file is kept beside it as path.format<N>, untouched: it is what a
// rollback to the earlier release opens (see docs/journal.md). A crash part way
// leaves the old journal where it was, and the next start begins again.
func upgradeFile(path string, format uint32, o Options) (err error) {
	o.Logger.Info("upgrading the journal to a new format", "path", path, "from", format, "to", formatVersion)
	tmp := path + ".upgrading"
	_ = os.Remove(tmp)
	src, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("upgrade: %w", err)
	}
	defer func() {
		if src != nil {
			_ = src.Close()
		}
		if err != nil {
			_ = os.Remove(tmp)
			err = &upgradeError{err}
		}
	}()
	dst, _, err := Open(tmp, Options{Sync: SyncNone, MaxSize: -1, Retention: 1 << 62, Logger: o.Logger, Now: o.Now, AsyncDelay: -1})
	if err != nil {
		return err
	}
	var marks map[string]int64
	var instance string
	err = src.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		instance = string(meta.Get(metaInstance))
		marks = readMarks(meta)
		return salvageOld(tx, nil, func(k Key, recs []Record) { dst.AppendAsync(k, recs...) })
	})
	if err == nil {
		err = dst.keepInstanceID(instance)
	}
	if err == nil {
		err = dst.SetMarks(context.Background(), marks)
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := syncFile(tmp); err != nil {
		return err
	}
	_ = src.Close()
	src = nil
	aside := fmt.Sprintf("%s.format%d", path, format)
	if err := os.Rename(path, aside); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Rename(aside, path)
		return err
	}
	if err := syncFile(filepath.Dir(path)); err != nil {
		return err
	}
	o.Logger.Info("journal upgraded; the earlier file is kept for a rollback", "path", path, "kept", aside)
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// salvageOld reads the hand-offs of a format 1 or 2 journal in tx, whole or
// in part: fn gets each hand-off's records that can be read, in order, and
// rep (when set) counts those that cannot. Both formats' buckets are read
// in a journal whose upgrade stopped part way.
func salvageOld(tx *bolt.Tx, rep *RepairReport, fn func(Key, []Record)) error {
	records, steps := tx.Bucket(bucketRecords), tx.Bucket(bucketSteps)
	if records == nil && steps == nil {
		return errors.New("no records bucket")
	}
	if rep == nil {
		rep = &RepairReport{}
	}
	if records != nil {
		salvageRecords(records, rep, fn)
	}
	if steps != nil {
		salvageSteps(steps, rep, fn)
	}
	return nil
}

// salvageRecords reads the records of a format 2 journal. A record whose
// hand-off key cannot be read is lost with it.
func salvageRecords(b *bolt.Bucket, rep *RepairReport, fn func(Key, []Record)) {
	var id []byte
	var key *Key
	var recs []Record
	flush := func() {
		if key != nil && len(recs) > 0 {
			fn(*key, recs)
		}
		recs = nil
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) != 2*idLen {
			rep.Lost++
			continue
		}
		if binary.BigEndian.Uint64(k[idLen:]) == 0 {
			flush()
			id, key = append(id[:0], k[:idLen]...), nil
			if k, rest, err := decodeKey(v); err == nil && len(rest) == 0 {
				key = &k
			} else {
				rep.Lost++
			}
			continue
		}
		rec, err := Decode(v)
		if err != nil || key == nil || !bytes.Equal(k[:idLen], id) {
			rep.Lost++
			continue
		}
		recs = append(recs, rec)
	}
	flush()
}

// salvageSteps reads the records of a format 1 journal.
func salvageSteps(b *bolt.Bucket, rep *RepairReport, fn func(Key, []Record)) {
	var cur []byte
	var key Key
	var recs []Record
	flush := func() {
		if len(recs) > 0 {
			fn(key, recs)
		}
		recs = nil
	}
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		rec, err := Decode(v)
		if err != nil || len(k) < 8 {
			rep.Lost++
			continue
		}
		kb := k[:len(k)-8]
		if !bytes.Equal(kb, cur) {
			flush()
			dk, rest, err := decodeKey(kb)
			if err != nil || len(rest) != 0 {
				rep.Lost++
				cur = nil
				continue
			}
			cur, key = append(cur[:0], kb...), dk
		}
		recs = append(recs, rec)
	}
	flush()
}

// upgradeError is a failed upgrade: the journal is where it was, in its
// earlier format, and the next start begins the upgrade again.
type upgradeError struct{ err error }

func (e *upgradeError) Error() string {
	return fmt.Sprintf("upgrading the journal to format %d: %v (the journal is unchanged; the next start tries again)", formatVersion, e.err)
}

func (e *upgradeError) Unwrap() error { return e.err }
