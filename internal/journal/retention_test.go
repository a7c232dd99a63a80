package journal

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestCompact drops history by the log's order: the oldest values go once
// their newest record is older than Retention. A closed hand-off loses
// what is that old, an open one is written again whole at the log's end
// while its latest record is younger than that, and goes with the range
// that holds it once its latest record is as old.
func TestCompact(t *testing.T) {
	const retention = time.Hour
	type handoff struct {
		name string
		// recs are written in the order of their times, an offset from
		// t0, each in a commit of its own, as a running sidecar writes them.
		recs []Record
		// left is how many of its records are left after each compaction.
		left []int
	}
	// Compactions run at these offsets from t0.
	compactAt := []time.Duration{30 * time.Minute, 61 * time.Minute, 2 * time.Hour, 4 * time.Hour}
	// Hand-offs whose history's start each compaction drops, and that are
	// not written again.
	dropped := []int{0, 4, 1, 4}
	handoffs := []handoff{
		{name: "settled long ago", recs: storySettledSuccess(at(0)), left: []int{4, 0, 0, 0}},
		{name: "settled at 59m", recs: storySettledSuccess(at(59 * time.Minute)), left: []int{4, 4, 0, 0}},
		{name: "settled at 90m", recs: storySettledSuccess(at(90 * time.Minute)), left: []int{4, 4, 4, 0}},
		{name: "settled after a copy", recs: storySettledCopy(at(0)), left: []int{6, 0, 0, 0}},
		{
			name: "settled at hop 0, received at hop 1, still open",
			recs: append(storySettledCopy(at(0)), Record{Kind: Received, At: at(50 * time.Minute), Hop: 1}),
			// Written again whole at 61m; at 2h its latest record is as old
			// as Retention, and it goes with the range its copy is in.
			left: []int{7, 7, 7, 0},
		},
		{
			name: "settled at hop 0, settled again at hop 1",
			recs: append(storySettledCopy(at(0)),
				Record{Kind: Received, At: at(50 * time.Minute), Hop: 1},
				Record{Kind: Attempt, At: at(51 * time.Minute), Hop: 1, Attempt: 2},
				Record{Kind: Outcome, At: at(52 * time.Minute), Hop: 1, Attempt: 2, Outcome: outSuccess},
				Record{Kind: Settled, At: at(53 * time.Minute), Hop: 1}),
			left: []int{10, 4, 0, 0},
		},
		{name: "open, last record old", recs: storyInCall(at(0)), left: []int{2, 0, 0, 0}},
		{
			name: "open, received long ago, last record recent",
			recs: append(storyReceived(at(0)), Record{Kind: Attempt, At: at(100 * time.Minute), Attempt: 1}),
			left: []int{2, 2, 2, 0},
		},
		{name: "open, transferring", recs: storyTransferring(at(90 * time.Minute)), left: []int{4, 4, 4, 0}},
	}
	clock := newFakeClock()
	j, _ := openJournal(t, newPath(t), Options{Now: clock.Now, Retention: retention})
	keyOf := func(h handoff) Key { return Key{Source: "retention", EventID: h.name} }
	type write struct {
		k   Key
		rec Record
	}
	var writes []write
	for _, h := range handoffs {
		for _, r := range h.recs {
			writes = append(writes, write{keyOf(h), r})
		}
	}
	slices.SortStableFunc(writes, func(a, b write) int { return a.rec.At.Compare(b.rec.At) })
	for _, w := range writes {
		appendOK(t, j, w.k, w.rec)
	}
	now := time.Duration(0)
	for step, c := range compactAt {
		clock.Advance(c - now)
		now = c
		t.Run(fmt.Sprintf("at %v", c), func(t *testing.T) {
			n, err := j.Compact()
			if err != nil {
				t.Fatalf("Compact: %v", err)
			}
			for _, h := range handoffs {
				if steps := timeline(t, j, keyOf(h)); len(steps) != h.left[step] {
					t.Errorf("%s: %d of %d records left, want %d", h.name, len(steps), len(h.recs), h.left[step])
				}
			}
			if n != dropped[step] {
				t.Errorf("Compact() = %d, want %d", n, dropped[step])
			}
		})
	}
	// Nothing is left behind in the indexes: a reopen finds nothing open.
	if _, rec := reopen(t, j, Options{Now: clock.Now, Retention: retention}); rec != (Recovery{}) {
		t.Errorf("Recovery after everything was compacted = %+v, want none", rec)
	}
}

// TestCompactLateSettleOfEarlierHop: a settle of hop 0 written after hop 1
// was received (the two Appends race) leaves hop 1 open as far as State can
// tell. Once its records are older than Retention it must be removed like
// any open hand-off — not kept forever because it is in neither index.
func TestCompactLateSettleOfEarlierHop(t *testing.T) {
	clock := newFakeClock()
	j, _ := openJournal(t, newPath(t), Options{Now: clock.Now, Retention: time.Hour})
	k := Key{Source: "s", EventID: "e"}
	appendOK(t, j, k, storyTransferred(at(0))...)
	appendOK(t, j, k, Record{Kind: Received, At: at(time.Second), Hop: 1})
	appendOK(t, j, k, Record{Kind: Settled, At: at(2 * time.Second), Hop: 0})
	appendOK(t, j, k, Record{Kind: Attempt, At: at(30 * time.Minute), Hop: 1, Attempt: 2}) // then the process stops
	for _, d := range []time.Duration{time.Hour + time.Minute, 3 * time.Hour, 24 * time.Hour} {
		clock.Advance(d - clock.Now().Sub(t0))
		if _, err := j.Compact(); err != nil {
			t.Fatalf("Compact: %v", err)
		}
	}
	if steps := timeline(t, j, k); len(steps) != 0 {
		t.Errorf("%d records left a day after the last one, want the hand-off removed (Retention is 1h)", len(steps))
	}
}

// TestCompactManyInOneCall removes more hand-offs than one transaction
// takes, so Compact has to go round again.
func TestCompactManyInOneCall(t *testing.T) {
	defer func(n int) { dropChunk = n }(dropChunk)
	dropChunk = 16 << 10
	const settled, open = 1543, 515
	clock := newFakeClock()
	j, _ := openJournal(t, newPath(t), Options{Now: clock.Now, Retention: time.Hour, Sync: SyncNone})
	for i := range settled {
		j.AppendAsync(Key{Source: "settled", EventID: fmt.Sprint(i)}, storySettledSuccess(at(0))...)
	}
	for i := range open {
		j.AppendAsync(Key{Source: "open", EventID: fmt.Sprint(i)}, storyInCall(at(0))...)
	}
	// The queue flushed first, so that the one kept is in a value of its own.
	if err := j.Probe(t.Context()); err != nil {
		t.Fatal(err)
	}
	keep := Key{Source: "keep"}
	appendOK(t, j, keep, storySettledSuccess(at(90*time.Minute))...)
	clock.Advance(2 * time.Hour)
	n, err := j.Compact()
	if err != nil {
		t.Fatalf("Compact: %v", err)
	}
	if n != settled+open {
		t.Errorf("Compact() = %d, want %d", n, settled+open)
	}
	var left []string
	if err := j.Scan(Filter{}, func(k Key, _ []Step) error { left = append(left, k.String()); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(left, []string{keep.String()}) {
		t.Errorf("after Compact %d hand-offs left (%q…), want only %s", len(left), left[:min(5, len(left))], keep)
	}
}

// TestRetentionSteadyState runs a steady load with compaction and checks
// that the file stops growing once retention covers a constant window.
func TestRetentionSteadyState(t *testing.T) {
	const (
		rounds    = 200
		perRound  = 500
		round     = time.Minute
		retention = 20 * round
	)
	// Index segments small enough that many come and go in the run, as they
	// do in a long one.
	defer func(n int) { sealAt = n }(sealAt)
	sealAt = 2048
	clock := newFakeClock()
	path := newPath(t)
	j, _ := openJournal(t, path, Options{Now: clock.Now, Retention: retention, Sync: SyncNone})
	// The file grows in steps (bbolt doubles it up to 1 GB), so the high
	// water mark of pages in use is watched too: it shows slow growth the
	// file size hides.
	sizes, marks := make([]int64, rounds+1), make([]int64, rounds+1)
	for r := 1; r <= rounds; r++ {
		now := clock.Advance(round)
		for i := range perRound {
			k := Key{Source: "steady", EventID: fmt.Sprintf("r%03d-%03d", r, i)}
			j.AppendAsync(k,
				Record{Kind: Received, At: now},
				Record{Kind: Attempt, At: now, Attempt: 1},
				Record{Kind: Outcome, At: now, Attempt: 1, Outcome: outSuccess, Status: 200, Latency: 3 * time.Millisecond},
				Record{Kind: Settled, At: now, Detail: "handled"})
		}
		// An Append waits for the queue ahead of it: the round is written.
		appendOK(t, j, Key{Source: "steady", EventID: "marker"}, Record{Kind: Released, At: now})
		if _, err := j.Compact(); err != nil {
			t.Fatalf("round %d: Compact: %v", r, err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		sizes[r] = fi.Size()
		if err := j.db.View(func(tx *bolt.Tx) error { marks[r] = tx.Size(); return nil }); err != nil {
			t.Fatal(err)
		}
		if r%10 == 0 {
			t.Logf("round %3d: file %8d bytes, high water mark %8d bytes", r, sizes[r], marks[r])
		}
	}
	// Hand-offs settled at or after now-retention stay: retention/round+1
	// rounds of them.
	n := 0
	if err := j.Scan(Filter{}, func(k Key, _ []Step) error {
		if k.EventID != "marker" {
			n++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := (int(retention/round) + 1) * perRound; n != want {
		t.Errorf("%d hand-offs kept, want %d", n, want)
	}
	for _, m := range []struct {
		what string
		at   []int64
	}{{"file size", sizes}, {"high water mark", marks}} {
		mid, end := m.at[rounds/2], m.at[rounds]
		growth := float64(end-mid) / float64(mid)
		t.Logf("%s after round %d: %d bytes, after round %d: %d bytes (%+.1f%%)", m.what, rounds/2, mid, rounds, end, 100*growth)
		if growth > 0.10 || growth < -0.10 {
			t.Errorf("%s went from %d to %d bytes (%+.1f%%) under a steady load, want within 10%%", m.what, mid, end, 100*growth)
		}
	}
}

// TestCompactedHandoffStartsAfresh: an event that comes back after its
// hand-off was compacted away is written as a new hand-off, under its own
// key, not into the removed one's place (which the writer had just used).
func TestCompactedHandoffStartsAfresh(t *testing.T) {
	clock := newFakeClock()
	j, _ := openJournal(t, newPath(t), Options{Retention: time.Hour, Now: clock.Now})
	k := Key{Source: "s", EventID: "back-again"}
	appendOK(t, j, k, storySettledSuccess(clock.Now())...)
	clock.Advance(2 * time.Hour)
	if n, err := j.Compact(); err != nil || n != 1 {
		t.Fatalf("Compact = %d, %v; want the one hand-off removed", n, err)
	}
	appendOK(t, j, k, Record{Kind: Received})
	if got := timeline(t, j, k); len(got) != 1 || got[0].Kind != Received {
		t.Fatalf("timeline of the returning event = %+v, want its one new record", got)
	}
	n := 0
	if err := j.Scan(Filter{}, func(got Key, _ []Step) error {
		if n++; got != k {
			t.Errorf("Scan found %s", got)
		}
		return nil
	}); err != nil {
		t.Fatalf("Scan: %v", err)
	}
	if n != 1 {
		t.Errorf("Scan found %d hand-offs, want 1", n)
	}
}
