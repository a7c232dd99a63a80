package journal

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// openValue and parseOpenValue are the earlier formats' open index value:
// the time the hand-off opened and its latest hop.
func openValue(at time.Time, hop int) []byte {
	return binary.AppendUvarint(appendTime(make([]byte, 0, 8+binary.MaxVarintLen64), at), uint64(hop))
}

func parseOpenValue(v []byte) (time.Time, int, bool) {
	if len(v) < 8 {
		return time.Time{}, 0, false
	}
	hop, w := binary.Uvarint(v[8:])
	if w <= 0 {
		return time.Time{}, 0, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v[:8]))), int(hop), true
}

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
	wantPath := newPath(t)
	want, _ := openJournal(t, wantPath, Options{Now: clock.Now})
	for _, k := range keys {
		appendOK(t, want, k, stories[k]...)
	}
	want, wantRec := reopen(t, want, Options{Now: clock.Now})

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

// TestUpgradeAfterACrashedOne: an upgrade writes the new file beside the
// old one and only then puts it in its place; one cut short leaves the old
// journal as it was, and the next start upgrades it whole. The old file is
// kept, byte for byte, for a rollback.
func TestUpgradeAfterACrashedOne(t *testing.T) {
	keys, stories := format1Stories(100)
	path := newPath(t)
	writeFormat1(t, path, keys, stories)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// What a crash part way leaves: a new file that never took the place.
	if err := os.WriteFile(path+".upgrading", []byte("half a journal"), 0o600); err != nil {
		t.Fatal(err)
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
		t.Errorf("%d hand-offs after the upgrade, want %d", n, len(keys))
	}
	kept, err := os.ReadFile(path + ".format1")
	if err != nil || !bytes.Equal(kept, before) {
		t.Errorf("the format 1 file kept for a rollback differs from the journal before the upgrade (%v)", err)
	}
	if _, err := os.Stat(path + ".upgrading"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the upgrade's working file is left behind: %v", err)
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

// TestUpgradeSkipsADamagedRecord: a record that cannot be read does not
// stop the upgrade; the rest of its hand-off and every other one come
// across, and the old file keeps the damaged record for a look.
func TestUpgradeSkipsADamagedRecord(t *testing.T) {
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
	if steps := timeline(t, j, damaged); len(steps) != len(stories[damaged])-1 {
		t.Fatalf("timeline of the damaged hand-off = %+v, want its %d readable records", steps, len(stories[damaged])-1)
	}
	for _, k := range keys[:len(keys)-1] {
		if got := timeline(t, j, k); len(got) != len(stories[k]) {
			t.Errorf("%s: %d records, want %d", k, len(got), len(stories[k]))
		}
	}
}

// format2Want is what the release that wrote testdata/format2.journal read
// in it: the instance id, the recovery counts, and each hand-off's state
// and timeline.
type format2Want struct {
	Instance  string
	Recovery  Recovery
	States    map[string]State
	Timelines map[string][]Step
}

// TestUpgradeFromFormat2 opens a journal written by the release before this
// layout (testdata/format2.journal: hand-offs in every phase, a replay, a
// Kafka position, a mark) and reads in it what that release read: the same
// instance id, recovery counts, states and timelines.
func TestUpgradeFromFormat2(t *testing.T) {
	var want format2Want
	data, err := os.ReadFile("testdata/format2.want.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	path := newPath(t)
	if err := copyFile("testdata/format2.journal", path); err != nil {
		t.Fatal(err)
	}
	j, rec := openJournal(t, path, Options{})
	if rec != want.Recovery {
		t.Errorf("Recovery = %+v, want %+v", rec, want.Recovery)
	}
	if j.InstanceID() != want.Instance {
		t.Errorf("instance id %q, want %q", j.InstanceID(), want.Instance)
	}
	if v, ok, err := j.Mark("kafka:payments/0"); err != nil || !ok || v != 7 {
		t.Errorf("mark = %d, %v, %v; want 7", v, ok, err)
	}
	if len(want.States) != 8 {
		t.Fatalf("the fixture holds %d hand-offs, want 8", len(want.States))
	}
	for name, ws := range want.States {
		k := keyOf(t, name)
		gs, err := j.State(k)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normState(gs), normState(ws)) {
			t.Errorf("%s: State = %+v, want %+v", name, gs, ws)
		}
		got := timeline(t, j, k)
		if len(got) != len(want.Timelines[name]) {
			t.Fatalf("%s: %d records, want %d", name, len(got), len(want.Timelines[name]))
		}
		for i := range got {
			if !equalRecord(got[i].Record, want.Timelines[name][i].Record) {
				t.Errorf("%s record %d = %+v, want %+v", name, i, got[i].Record, want.Timelines[name][i].Record)
			}
		}
	}
	if _, err := os.Stat(path + ".format2"); err != nil {
		t.Errorf("the format 2 file is not kept for a rollback: %v", err)
	}
}

// keyOf reads a Key back from its String.
func keyOf(t *testing.T, s string) Key {
	t.Helper()
	src, rest, ok := strings.Cut(s, "/")
	if !ok {
		t.Fatalf("key %q", s)
	}
	id, replay, _ := strings.Cut(rest, "@")
	return Key{Source: src, EventID: id, ReplayID: replay}
}

// normState makes two states comparable: times in UTC, Last's time only.
func normState(s State) State {
	s.FirstAttemptAt = s.FirstAttemptAt.UTC()
	s.Last = Record{Kind: s.Last.Kind, At: s.Last.At.UTC()}
	if s.Copy != nil {
		c := *s.Copy
		c.At = c.At.UTC()
		s.Copy = &c
	}
	return s
}

// TestRepairFormat2: a damaged journal of the release before this layout is
// repaired into this one, with every readable record.
func TestRepairFormat2(t *testing.T) {
	var want format2Want
	data, err := os.ReadFile("testdata/format2.want.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "journal.db")
	if err := copyFile("testdata/format2.journal", path); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, tl := range want.Timelines {
		total += len(tl)
	}
	rep, err := Repair(path)
	if err != nil || rep.Stopped != nil || rep.Kept != total || rep.Lost != 0 {
		t.Fatalf("Repair = %+v, %v; want %d records kept, none lost", rep, err, total)
	}
	j, _ := openJournal(t, path, Options{})
	if j.InstanceID() != want.Instance {
		t.Errorf("instance id %q after the repair, want %q", j.InstanceID(), want.Instance)
	}
	for name, tl := range want.Timelines {
		if got := timeline(t, j, keyOf(t, name)); len(got) != len(tl) {
			t.Errorf("%s: %d records after the repair, want %d", name, len(got), len(tl))
		}
	}
}
