package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestRecovery leaves hand-offs open in every phase, a different number in
// each so that one phase counted as another shows, and reopens.
func TestRecovery(t *testing.T) {
	tests := []struct {
		name  string
		story func(base time.Time) []Record
		count int
		// field is the Recovery counter the phase belongs to; nil: settled.
		field func(*Recovery) *int
	}{
		{name: "received only", story: storyReceived, count: 1, field: func(r *Recovery) *int { return &r.Received }},
		{name: "attempt without outcome", story: storyInCall, count: 2, field: func(r *Recovery) *int { return &r.InCall }},
		{name: "handled not settled", story: storyHandled, count: 3, field: func(r *Recovery) *int { return &r.Handled }},
		{name: "dropped not settled", story: func(b time.Time) []Record {
			return append(storyInCall(b), Record{Kind: Outcome, At: b.Add(time.Second), Attempt: 1, Outcome: outDrop})
		}, count: 4, field: func(r *Recovery) *int { return &r.Handled }},
		{name: "transferring not transferred", story: storyTransferring, count: 5, field: func(r *Recovery) *int { return &r.Unconfirmed }},
		{name: "transferred not settled", story: storyTransferred, count: 6, field: func(r *Recovery) *int { return &r.Confirmed }},
		{name: "failed without a copy", story: storyFailed, count: 7, field: func(r *Recovery) *int { return &r.Failed }},
		{name: "released without an attempt", story: func(b time.Time) []Record {
			return append(storyReceived(b), Record{Kind: Released, At: b.Add(time.Second), Detail: "shutdown"})
		}, count: 8, field: func(r *Recovery) *int { return &r.Received }},
		{name: "copy received at hop 1", story: func(b time.Time) []Record {
			return append(storySettledCopy(b), Record{Kind: Received, At: b.Add(time.Second), Hop: 1})
		}, count: 9, field: func(r *Recovery) *int { return &r.Received }},
		{name: "copy in a call at hop 1", story: func(b time.Time) []Record {
			return append(storySettledCopy(b), Record{Kind: Received, At: b.Add(time.Second), Hop: 1}, Record{Kind: Attempt, At: b.Add(2 * time.Second), Hop: 1, Attempt: 2})
		}, count: 10, field: func(r *Recovery) *int { return &r.InCall }},
		{name: "settled after success", story: storySettledSuccess, count: 11},
		{name: "settled after a confirmed copy", story: storySettledCopy, count: 12},
		{name: "settled at hop 1", story: func(b time.Time) []Record {
			return append(storySettledCopy(b),
				Record{Kind: Received, At: b.Add(time.Second), Hop: 1},
				Record{Kind: Attempt, At: b.Add(2 * time.Second), Hop: 1, Attempt: 2},
				Record{Kind: Outcome, At: b.Add(3 * time.Second), Hop: 1, Attempt: 2, Outcome: outSuccess},
				Record{Kind: Settled, At: b.Add(4 * time.Second), Hop: 1})
		}, count: 13},
		{name: "settled without a received", story: func(b time.Time) []Record {
			return []Record{{Kind: Settled, At: b}}
		}, count: 14},
	}
	path := newPath(t)
	j, rec := openJournal(t, path, Options{})
	if rec != (Recovery{}) {
		t.Errorf("Recovery of a new file = %+v, want zero", rec)
	}
	var want Recovery
	for _, tt := range tests {
		for i := range tt.count {
			k := Key{Source: tt.name, EventID: fmt.Sprint(i)}
			// One Append per record, as dispatch writes them.
			for _, r := range tt.story(at(0)) {
				appendOK(t, j, k, r)
			}
		}
		if tt.field != nil {
			*tt.field(&want) += tt.count
			want.Open += tt.count
		}
	}
	j, got := reopen(t, j, Options{})
	if got != want {
		t.Errorf("Recovery =\n%+v\nwant\n%+v", got, want)
	}
	// Each phase on its own, so a wrong count names the phase.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j2, _ := openJournal(t, filepath.Join(t.TempDir(), "one.db"), Options{})
			for i := range tt.count {
				appendOK(t, j2, Key{Source: "s", EventID: fmt.Sprint(i)}, tt.story(at(0))...)
			}
			_, got := reopen(t, j2, Options{})
			var want Recovery
			if tt.field != nil {
				*tt.field(&want) = tt.count
				want.Open = tt.count
			}
			if got != want {
				t.Errorf("Recovery = %+v, want %+v", got, want)
			}
		})
	}
	// Reopening again changes nothing: recovery reads, it does not settle.
	if _, again := reopen(t, j, Options{}); again != want {
		t.Errorf("second reopen: Recovery = %+v, want %+v", again, want)
	}
}

// TestRecoveryLateSettleOfEarlierHop: the copy of hop 0 can be delivered
// (RECEIVED hop 1) before the source's ack is written (SETTLED hop 0); the
// two Appends race. The late settle is of hop 0 — State says hop 1 is open
// — so the hand-off must still count as open after a restart.
func TestRecoveryLateSettleOfEarlierHop(t *testing.T) {
	j, _ := openJournal(t, newPath(t), Options{})
	k := Key{Source: "s", EventID: "e"}
	appendOK(t, j, k, storyTransferred(at(0))...)
	appendOK(t, j, k, Record{Kind: Received, At: at(time.Second), Hop: 1})
	appendOK(t, j, k, Record{Kind: Settled, At: at(2 * time.Second), Hop: 0, Detail: "copied"})
	st, err := j.State(k)
	if err != nil {
		t.Fatal(err)
	}
	if st.Settled || st.Hop != 1 {
		t.Fatalf("State = hop %d settled %v, want hop 1 not settled", st.Hop, st.Settled)
	}
	var open []Key
	if err := j.Scan(Filter{Open: true}, func(k Key, _ []Step) error { open = append(open, k); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(open) != 1 {
		t.Errorf("Scan(Open) = %v, want [%s]: hop 1 is not settled", open, k)
	}
	_, rec := reopen(t, j, Options{})
	if want := (Recovery{Open: 1, Received: 1}); rec != want {
		t.Errorf("Recovery = %+v, want %+v", rec, want)
	}
}

func TestRecoveryString(t *testing.T) {
	r := Recovery{Open: 21, Received: 1, InCall: 2, Handled: 3, Unconfirmed: 4, Confirmed: 5, Failed: 6}
	want := "21 open: 1 received, 2 in a call, 3 handled not acked, 4 copy unconfirmed, 5 copy confirmed not acked, 6 failed without a copy"
	if got := r.String(); got != want {
		t.Errorf("String() =\n%q\nwant\n%q", got, want)
	}
}

// validJournal writes a journal with some settled and some open hand-offs
// and returns its path, closed.
func validJournal(t *testing.T, handoffs int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal.db")
	j, _, err := Open(path, testOptions(Options{Sync: SyncNone}))
	if err != nil {
		t.Fatal(err)
	}
	for i := range handoffs {
		k := Key{Source: "src", EventID: fmt.Sprintf("event-%06d", i), ReplayID: strings.Repeat("r", i%7)}
		story := storySettledCopy(at(time.Duration(i) * time.Millisecond))
		if i%3 == 0 {
			story = storyTransferring(at(time.Duration(i) * time.Millisecond))
		}
		if err := j.Append(t.Context(), k, story...); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// pageSize of the files written here: bbolt takes the OS page size.
func pageSize(t *testing.T, b []byte) int {
	t.Helper()
	// Page 0 is a meta page: header (16 bytes), then magic, version, page size.
	if len(b) < 32 {
		t.Fatalf("file of %d bytes", len(b))
	}
	return int(binary.LittleEndian.Uint32(b[16+8 : 16+12]))
}

// highWater is the number of pages in use, from the newer meta page: the
// file past it is space bbolt allocated ahead, and damage there is no damage.
func highWater(t *testing.T, b []byte) int {
	t.Helper()
	ps := pageSize(t, b)
	var pgid, txid uint64
	for m := range 2 {
		meta := b[m*ps+16:] // page header, then magic, version, page size, flags, root, sequence, freelist, pgid, txid
		if tx := binary.LittleEndian.Uint64(meta[48:]); tx >= txid {
			pgid, txid = binary.LittleEndian.Uint64(meta[40:]), tx
		}
	}
	if pgid < 4 || int(pgid)*ps > len(b) {
		t.Fatalf("high water mark %d pages in a file of %d", pgid, len(b)/ps)
	}
	return int(pgid)
}

// TestOpenCorrupt damages files in ways Open must refuse: it returns a
// *CorruptError that tells the operator what to do, and leaves the file
// exactly as it was (it is evidence, and `repair` needs it).
func TestOpenCorrupt(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	garbage := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	// Valid journals to damage, written once: they take a while.
	valid := map[int][]byte{}
	validBytes := func(t *testing.T, handoffs int) []byte {
		if valid[handoffs] == nil {
			valid[handoffs] = readFile(t, validJournal(t, handoffs))
		}
		return append([]byte(nil), valid[handoffs]...)
	}
	tests := []struct {
		name string
		// make writes the damaged file at path.
		make func(t *testing.T, path string)
	}{
		{name: "garbage", make: func(t *testing.T, path string) { writeFile(t, path, garbage(64<<10)) }},
		{name: "zeros", make: func(t *testing.T, path string) { writeFile(t, path, make([]byte, 32<<10)) }},
		{name: "a few bytes", make: func(t *testing.T, path string) { writeFile(t, path, []byte("not a journal\n")) }},
		{name: "both meta pages damaged", make: func(t *testing.T, path string) {
			b := validBytes(t, 50)
			ps := pageSize(t, b)
			copy(b[16:ps], garbage(ps-16))
			copy(b[ps+16:2*ps], garbage(ps-16))
			writeFile(t, path, b)
		}},
		{name: "truncated to half", make: func(t *testing.T, path string) {
			b := validBytes(t, 2000)
			writeFile(t, path, b[:highWater(t, b)/2*pageSize(t, b)])
		}},
		{name: "truncated to the meta pages", make: func(t *testing.T, path string) {
			b := validBytes(t, 2000)
			writeFile(t, path, b[:2*pageSize(t, b)])
		}},
		{name: "middle pages overwritten with garbage", make: func(t *testing.T, path string) {
			b := validBytes(t, 2000)
			ps := pageSize(t, b)
			for p := 2; p < highWater(t, b); p++ {
				copy(b[p*ps:(p+1)*ps], garbage(ps))
			}
			writeFile(t, path, b)
		}},
		{name: "middle pages zeroed", make: func(t *testing.T, path string) {
			b := validBytes(t, 2000)
			ps := pageSize(t, b)
			clear(b[2*ps : highWater(t, b)*ps])
			writeFile(t, path, b)
		}},
		{name: "root page of the log bucket overwritten", make: func(t *testing.T, path string) {
			src := filepath.Join(t.TempDir(), "src.db")
			writeFile(t, src, validBytes(t, 2000))
			var root uint64
			db, err := bolt.Open(src, 0o600, &bolt.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			_ = db.View(func(tx *bolt.Tx) error { root = uint64(tx.Bucket(bucketLog).Root()); return nil })
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			b := readFile(t, src)
			ps := pageSize(t, b)
			if root < 2 || int(root+1)*ps > len(b) {
				t.Fatalf("records bucket root is page %d of %d", root, len(b)/ps)
			}
			copy(b[int(root)*ps:int(root+1)*ps], garbage(ps))
			writeFile(t, path, b)
		}},
		{name: "format from a later build", make: func(t *testing.T, path string) {
			src := filepath.Join(t.TempDir(), "src.db")
			writeFile(t, src, validBytes(t, 10))
			updateFile(t, src, func(tx *bolt.Tx) error {
				return tx.Bucket(bucketMeta).Put(metaFormat, binary.BigEndian.AppendUint32(nil, formatVersion+1))
			})
			writeFile(t, path, readFile(t, src))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.db")
			tt.make(t, path)
			before := readFile(t, path)
			got := openInChild(t, path)
			switch {
			case got.Crashed != "":
				t.Fatalf("Open crashed the process instead of returning an error:\n%s", got.Crashed)
			case got.Err == "":
				t.Fatalf("Open of a damaged file succeeded (Recovery %s)", got.Recovery)
			case got.Panicked:
				t.Fatalf("Open panicked: %s", got.Err)
			case !got.Corrupt:
				t.Fatalf("Open = %s, want a *CorruptError", got.Err)
			}
			if got.Path != path {
				t.Errorf("CorruptError.Path = %q, want %q", got.Path, path)
			}
			for _, want := range []string{path, "sidecar journal repair", "sidecar journal reset"} {
				if !strings.Contains(got.Err, want) {
					t.Errorf("error %q does not mention %q", got.Err, want)
				}
			}
			if !got.HasCause {
				t.Errorf("CorruptError has no cause")
			}
			if after := readFile(t, path); !bytes.Equal(before, after) {
				d := firstDiff(before, after)
				t.Errorf("Open modified the damaged file: %d bytes before, %d after, first difference at byte %d (page %d)",
					len(before), len(after), d, d/pageSize(t, before))
			}
			if got.Leaked != "" {
				t.Errorf("goroutines left running after the failed Open:\n%s", got.Leaked)
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestOpenValidFileKeepsData is the control for TestOpenCorrupt: the file
// validJournal writes opens, with its open hand-offs counted.
func TestOpenValidFileKeepsData(t *testing.T) {
	path := validJournal(t, 30)
	j, rec := openJournal(t, path, Options{})
	if want := (Recovery{Open: 10, Unconfirmed: 10}); rec != want {
		t.Errorf("Recovery = %+v, want %+v", rec, want)
	}
	n := 0
	if err := j.Scan(Filter{}, func(Key, []Step) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 30 {
		t.Errorf("Scan found %d hand-offs, want 30", n)
	}
}

// TestOpenLocked opens a file a Journal in this process holds. bbolt's
// flock is per open file, so the second open waits for the lock like
// another process would, and gives up after its one-second timeout.
func TestOpenLocked(t *testing.T) {
	path := newPath(t)
	j, _ := openJournal(t, path, Options{})
	appendOK(t, j, Key{Source: "s", EventID: "e"}, Record{Kind: Received})
	type result struct {
		j   *Journal
		err error
	}
	opened := make(chan result, 1)
	start := time.Now()
	go func() {
		j2, _, err := Open(path, testOptions(Options{}))
		opened <- result{j2, err}
	}()
	var j2 *Journal
	var err error
	select {
	case r := <-opened:
		j2, err = r.j, r.err
	case <-time.After(10 * time.Second):
		t.Fatal("second Open of a held file still waiting after 10s; it should give up after its 1s lock timeout")
	}
	took := time.Since(start)
	if err == nil {
		j2.Close()
		t.Fatal("second Open of a held file succeeded")
	}
	if !errors.Is(err, ErrLocked) {
		t.Errorf("second Open = %v, want ErrLocked", err)
	}
	var ce *CorruptError
	if errors.As(err, &ce) {
		t.Errorf("a locked file is reported as corrupt: %v", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the file", err)
	}
	t.Logf("second Open failed after %v: %v", took, err)
	// The holder is unaffected, and once it closes the file opens.
	appendOK(t, j, Key{Source: "s", EventID: "e"}, Record{Kind: Attempt, Attempt: 1})
	if _, rec := reopen(t, j, Options{}); rec.Open != 1 || rec.InCall != 1 {
		t.Errorf("Recovery after the holder closed = %+v, want one in a call", rec)
	}
}

// TestOpenMissingDirectory: a path whose directory does not exist is a
// configuration mistake, not a damaged journal; the CorruptError's advice
// (repair, reset) would send the operator the wrong way.
func TestOpenMissingDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing-dir", "journal.db")
	_, _, err := Open(path, testOptions(Options{}))
	if err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open in a missing directory = %v, want an error wrapping os.ErrNotExist", err)
	}
	var ce *CorruptError
	if errors.As(err, &ce) {
		t.Errorf("Open in a missing directory = a *CorruptError: %v", err)
	}
}

// TestOpenWithADamagedPart: a part of the log that fails its checksum does
// not keep the journal from opening. It is counted, the rest is read, and
// the state of its hand-off is an error, which dispatch answers by handling
// the message as new: at worst a duplicate call, never a lost message.
func TestOpenWithADamagedPart(t *testing.T) {
	path := validJournal(t, 10)
	updateFile(t, path, func(tx *bolt.Tx) error {
		// The first hand-off is open (a copy being published), and alone
		// in the log's first value: a byte of its last record.
		log := tx.Bucket(bucketLog)
		sk, v := log.Cursor().First()
		damaged := append([]byte(nil), v...)
		damaged[len(damaged)-5] ^= 0x40
		return log.Put(append([]byte(nil), sk...), damaged)
	})
	j, rec := openJournal(t, path, Options{})
	if rec.Unreadable != 1 {
		t.Errorf("Recovery = %+v, want 1 unreadable", rec)
	}
	damaged := Key{Source: "src", EventID: "event-000000"}
	if _, err := j.State(damaged); !errors.Is(err, ErrCorrupt) {
		t.Errorf("State of the damaged hand-off = %v, want ErrCorrupt", err)
	}
	if steps := timeline(t, j, damaged); len(steps) != 1 || steps[0].Kind != 0 {
		t.Errorf("timeline of the damaged hand-off = %+v, want one unreadable step", steps)
	}
	for i := 1; i < 10; i++ {
		k := Key{Source: "src", EventID: fmt.Sprintf("event-%06d", i), ReplayID: strings.Repeat("r", i%7)}
		if st, err := j.State(k); err != nil || !st.Found {
			t.Errorf("%s: %+v, %v", k, st, err)
		}
	}
}

// TestFailedOpenReleasesTheLock: a file whose damage makes bbolt panic
// while it opens (here: its freelist page, among those overwritten, after
// bbolt mapped the file) is not left locked: a repair in the same process can
// take it.
func TestFailedOpenReleasesTheLock(t *testing.T) {
	path := validJournal(t, 3)
	b := readFile(t, path)
	ps := pageSize(t, b)
	for i := 2 * ps; i < len(b) && i < 6*ps; i++ {
		b[i] = 0xA5
	}
	writeFile(t, path, b)
	for i := range 2 {
		_, _, err := Open(path, testOptions(Options{}))
		var corrupt *CorruptError
		if !errors.As(err, &corrupt) {
			t.Fatalf("Open %d of a damaged file = %v, want a CorruptError (not a lock held by the one before)", i+1, err)
		}
	}
}
