package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// writeFormat1 writes hand-offs into a new file in format 1's layout, the
// way that format's writer kept its records and indexes.
func writeFormat1(t *testing.T, path string, keys []Key, stories map[Key][]Record) {
	t.Helper()
	updateFile(t, path, func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		if err := meta.Put(metaFormat, binary.BigEndian.AppendUint32(nil, 1)); err != nil {
			return err
		}
		var bs [3]*bolt.Bucket
		for i, name := range [][]byte{bucketSteps, bucketOpen, bucketSettled} {
			if bs[i], err = tx.CreateBucket(name); err != nil {
				return err
			}
		}
		steps, open, settled := bs[0], bs[1], bs[2]
		for _, k := range keys {
			kb := k.encode(nil)
			for _, rec := range stories[k] {
				seq, _ := steps.NextSequence()
				if err := steps.Put(binary.BigEndian.AppendUint64(k.encode(nil), seq), rec.Encode(nil)); err != nil {
					return err
				}
				switch rec.Kind {
				case Received:
					v := open.Get(kb)
					if v == nil {
						err = open.Put(kb, openValue(rec.At, rec.Hop))
					} else if at, hop, _ := parseOpenValue(v); rec.Hop > hop {
						err = open.Put(kb, openValue(at, rec.Hop))
					}
				case Settled:
					if v := open.Get(kb); v != nil {
						if _, hop, _ := parseOpenValue(v); hop <= rec.Hop {
							err = open.Delete(kb)
						}
					}
					if err == nil {
						err = settled.Put(append(appendTime(nil, rec.At), kb...), nil)
					}
				}
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// format1Stories are hand-offs in every phase, with a reopened one (a retry
// copy received after its first hop settled) among them.
func format1Stories(n int) ([]Key, map[Key][]Record) {
	phases := []func(time.Time) []Record{storyReceived, storyInCall, storyHandled, storyFailed,
		storyTransferring, storyTransferred, storySettledCopy, storySettledSuccess}
	var keys []Key
	stories := map[Key][]Record{}
	for i := range n {
		k := Key{Source: "src", EventID: fmt.Sprintf("%08x", uint32(i)*2654435761), ReplayID: strings.Repeat("r", i%3)}
		story := phases[i%len(phases)](at(time.Duration(i) * time.Second))
		if i%len(phases) == len(phases)-2 && i%3 == 0 {
			story = append(story, Record{Kind: Received, At: at(time.Duration(i)*time.Second + time.Minute), Hop: 1})
		}
		keys = append(keys, k)
		stories[k] = story
	}
	return keys, stories
}

// TestUpgradeFromFormat1: a journal written by the previous format opens
// with every hand-off, its records and its indexes as they were: the same
// recovery counts, timelines, open hand-offs and retention.
func TestUpgradeFromFormat1(t *testing.T) {
	keys, stories := format1Stories(300)
	old := newPath(t)
	writeFormat1(t, old, keys, stories)

	// What the current format makes of the same records.
	clock := newFakeClock()
	want, wantRec := openJournal(t, newPath(t), Options{Now: clock.Now})
	for _, k := range keys {
		appendOK(t, want, k, stories[k]...)
	}
	wantRec = recoveryOf(t, want)

	j, rec := openJournal(t, old, Options{Now: clock.Now})
	if rec != wantRec || rec.Open == 0 {
		t.Errorf("Recovery after the upgrade = %+v, want %+v", rec, wantRec)
	}
	for _, k := range keys {
		got, exp := timeline(t, j, k), timeline(t, want, k)
		if len(got) != len(exp) {
			t.Fatalf("%s: %d records after the upgrade, want %d", k, len(got), len(exp))
		}
		for i := range got {
			if !equalRecord(got[i].Record, exp[i].Record) {
				t.Errorf("%s record %d = %+v, want %+v", k, i, got[i].Record, exp[i].Record)
			}
		}
		gs, err := j.State(k)
		if err != nil {
			t.Fatal(err)
		}
		ws, _ := want.State(k)
		if gs.Settled != ws.Settled || gs.Hop != ws.Hop || gs.Handled() != ws.Handled() || (gs.Copy == nil) != (ws.Copy == nil) {
			t.Errorf("%s: State = %+v, want %+v", k, gs, ws)
		}
	}
	var open, wantOpen int
	if err := j.Scan(Filter{Open: true}, func(Key, []Step) error { open++; return nil }); err != nil {
		t.Fatalf("Scan after the upgrade: %v", err)
	}
	if err := want.Scan(Filter{Open: true}, func(Key, []Step) error { wantOpen++; return nil }); err != nil {
		t.Fatal(err)
	}
	if open != wantOpen {
		t.Errorf("%d open hand-offs after the upgrade, want %d", open, wantOpen)
	}
	err := j.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(metaFormat); binary.BigEndian.Uint32(v) != formatVersion {
			return fmt.Errorf("format %x after the upgrade", v)
		}
		for _, name := range [][]byte{bucketSteps, bucketOpen, bucketSettled} {
			if tx.Bucket(name) != nil {
				return fmt.Errorf("format 1 bucket %q left behind", name)
			}
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	// The retention index came across: settled hand-offs expire, open
	// ones stay until they are as old.
	clock.Advance(24*time.Hour + time.Hour)
	got, err := j.Compact()
	if err != nil {
		t.Fatal(err)
	}
	exp, err := want.Compact()
	if err != nil {
		t.Fatal(err)
	}
	if got != exp || got != len(keys) {
		t.Errorf("compaction after the upgrade removed %d hand-offs, want %d (of %d)", got, exp, len(keys))
	}
}

// recoveryOf is what Open would report for j's file now.
func recoveryOf(t *testing.T, j *Journal) Recovery {
	t.Helper()
	var rec Recovery
	err := j.db.View(func(tx *bolt.Tx) error {
		b := j.buckets(tx)
		return b.pending.ForEach(func(id, _ []byte) error {
			s, err := b.state(id)
			rec.add(s)
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// partlyUpgraded writes 100 format 1 hand-offs at path and opens it with the
// upgrade's third transaction (of 40 records each) failing; it returns the
// hand-offs and Open's error.
func partlyUpgraded(t *testing.T, path string, crash error) ([]Key, map[Key][]Record, error) {
	t.Helper()
	defer func(n int) { upgradeChunk = n }(upgradeChunk)
	upgradeChunk = 40
	keys, stories := format1Stories(100)
	writeFormat1(t, path, keys, stories)
	txs := 0
	_, _, err := Open(path, testOptions(Options{BeforeCommit: func(int) error {
		if txs++; txs == 3 {
			return crash
		}
		return nil
	}}))
	return keys, stories, err
}

// repairKeepsAll repairs path and checks that every record of the stories
// was kept, and that each hand-off has all of its records after.
func repairKeepsAll(t *testing.T, path string, keys []Key, stories map[Key][]Record) {
	t.Helper()
	total := 0
	for _, k := range keys {
		total += len(stories[k])
	}
	rep, err := Repair(path)
	if err != nil || rep.Stopped != nil {
		t.Fatalf("Repair = %+v, %v", rep, err)
	}
	if rep.Kept != total || rep.Lost != 0 {
		t.Errorf("Repair kept %d and lost %d records, want %d and 0", rep.Kept, rep.Lost, total)
	}
	j, _ := openJournal(t, path, Options{})
	for _, k := range keys {
		if got := timeline(t, j, k); len(got) != len(stories[k]) {
			t.Errorf("%s: %d records after the repair, want %d", k, len(got), len(stories[k]))
		}
	}
}

// TestUpgradeResumesAfterAFailure: the upgrade moves hand-offs in
// transactions of their own; one that fails leaves a journal that the next
// start goes on upgrading, with every hand-off exactly once.
func TestUpgradeResumesAfterAFailure(t *testing.T) {
	crash := errors.New("crash")
	path := newPath(t)
	keys, stories, err := partlyUpgraded(t, path, crash)
	if !errors.Is(err, crash) {
		t.Fatalf("Open with the third upgrade transaction failing = %v, want the failure", err)
	}
	var corrupt *CorruptError
	if errors.As(err, &corrupt) {
		t.Errorf("a failed upgrade is reported as a damaged file: %v", err)
	}
	j, _ := openJournal(t, path, Options{})
	n := 0
	err = j.Scan(Filter{}, func(k Key, steps []Step) error {
		n++
		if len(steps) != len(stories[k]) {
			t.Errorf("%s: %d records, want %d", k, len(steps), len(stories[k]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != len(keys) {
		t.Errorf("%d hand-offs after the resumed upgrade, want %d", n, len(keys))
	}
}

// TestReadOnlyOpenOfFormat1 does not upgrade: a reader never writes.
func TestReadOnlyOpenOfFormat1(t *testing.T) {
	keys, stories := format1Stories(5)
	path := filepath.Join(t.TempDir(), "journal.db")
	writeFormat1(t, path, keys, stories)
	_, _, err := Open(path, testOptions(Options{ReadOnly: true}))
	if err == nil || !strings.Contains(err.Error(), "format 1") {
		t.Fatalf("read-only Open of a format 1 journal = %v, want an error naming the format", err)
	}
	j, _ := openJournal(t, path, Options{})
	if st, err := j.State(keys[2]); err != nil || !st.Found {
		t.Errorf("after a read-only attempt, the upgrade still finds %s: %+v, %v", keys[2], st, err)
	}
}

// TestRepairFormat1: a damaged journal of the previous format is repaired
// into the current one, with every readable record.
func TestRepairFormat1(t *testing.T) {
	keys, stories := format1Stories(20)
	path := filepath.Join(t.TempDir(), "journal.db")
	writeFormat1(t, path, keys, stories)
	repairKeepsAll(t, path, keys, stories)
}

// TestUpgradeKeepsADamagedRecord: a record that cannot be read moves across
// as it is, shown as unreadable, as format 1 showed it; the upgrade does not
// stop on it.
func TestUpgradeKeepsADamagedRecord(t *testing.T) {
	keys, stories := format1Stories(16)
	path := newPath(t)
	writeFormat1(t, path, keys, stories)
	damaged := keys[len(keys)-1] // a settled hand-off
	updateFile(t, path, func(tx *bolt.Tx) error {
		steps := tx.Bucket(bucketSteps)
		k, v := steps.Cursor().Seek(damaged.encode(nil))
		return damage(steps, k, v)
	})
	j, _ := openJournal(t, path, Options{})
	steps := timeline(t, j, damaged)
	if len(steps) != len(stories[damaged]) || steps[0].Kind != 0 || !strings.Contains(steps[0].Detail, ErrCorrupt.Error()) {
		t.Fatalf("timeline of the damaged hand-off = %+v, want its %d records, the first shown as unreadable", steps, len(stories[damaged]))
	}
	for _, k := range keys[:len(keys)-1] {
		if got := timeline(t, j, k); len(got) != len(stories[k]) {
			t.Errorf("%s: %d records, want %d", k, len(got), len(stories[k]))
		}
	}
}

// TestRepairOfAPartlyUpgradedJournal reads both layouts' buckets: the
// hand-offs the upgrade had moved and those it had not.
func TestRepairOfAPartlyUpgradedJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	keys, stories, err := partlyUpgraded(t, path, errors.New("crash"))
	if err == nil {
		t.Fatal("Open with a failing upgrade transaction succeeded")
	}
	repairKeepsAll(t, path, keys, stories)
}
