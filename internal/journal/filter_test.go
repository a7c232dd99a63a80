package journal

import (
	"fmt"
	"math/bits"
	"testing"
	"time"
)

// TestSegmentFilters: with more sealed segments than one sliced filter
// holds, every event is found in its newest segment and an unknown one in
// none, the same after a reopen, after segments of another shape join them,
// and after retention drops the oldest; a dropped segment's slot is freed.
func TestSegmentFilters(t *testing.T) {
	defer func(n int) { sealAt = n }(sealAt)
	sealAt = 64
	clock := newFakeClock()
	path := newPath(t)
	o := Options{Now: clock.Now, Retention: time.Hour, Sync: SyncNone}
	j, _ := openJournal(t, path, o)

	const segs = sliceSlots + 8
	var keys []Key
	write := func(n int) {
		t.Helper()
		now := clock.Now()
		for range n {
			k := Key{Source: "f", EventID: fmt.Sprintf("e-%05d", len(keys))}
			keys = append(keys, k)
			appendOK(t, j, k, storySettledSuccess(now)...)
		}
	}
	// A second hand-off of one event, many segments later: its newest
	// part is in the newer segment, and its timeline holds both.
	again := Key{Source: "f", EventID: "again"}
	appendOK(t, j, again, storySettledSuccess(clock.Now())...)
	write(segs / 2 * sealAt)
	appendOK(t, j, again, Record{Kind: Renewed, At: clock.Now()}, Record{Kind: Received, At: clock.Now()})
	write(segs/2*sealAt + sealAt/2)

	check := func(when string, from int) {
		t.Helper()
		for i, k := range keys {
			st, err := j.State(k)
			if err != nil {
				t.Fatal(err)
			}
			if st.Found != (i >= from) {
				t.Fatalf("%s: State(%s).Found = %v, want %v", when, k.EventID, st.Found, i >= from)
			}
		}
		for i := range 2000 {
			k := Key{Source: "f", EventID: fmt.Sprintf("never-%d", i)}
			if st, err := j.State(k); err != nil || st.Found {
				t.Fatalf("%s: State of an unknown event = %+v, %v", when, st, err)
			}
		}
		if from == 0 {
			if got := timeline(t, j, again); len(got) != len(storySettledSuccess(t0))+2 {
				t.Fatalf("%s: timeline of an event handed off twice has %d steps, want both hand-offs", when, len(got))
			}
		}
	}
	slotted := func(when string, want int) {
		t.Helper()
		n := 0
		for _, g := range j.idx.segs {
			if g.slot != nil {
				n++
			}
		}
		live := 0
		for _, f := range j.idx.filters {
			live += bits.OnesCount32(f.live)
		}
		if n != want || live != want {
			t.Fatalf("%s: %d segments in sliced filters, %d slots live; want %d (segments: %d)", when, n, live, want, len(j.idx.segs))
		}
	}

	if len(j.idx.segs) < segs {
		t.Fatalf("%d segments sealed, want at least %d", len(j.idx.segs), segs)
	}
	if len(j.idx.filters) != 2 {
		t.Fatalf("%d sliced filters for %d segments, want 2", len(j.idx.filters), len(j.idx.segs))
	}
	slotted("written", len(j.idx.segs))
	check("written", 0)

	j, _ = reopen(t, j, o)
	slotted("reopened", len(j.idx.segs))
	check("reopened", 0)

	// Segments of another shape (as an older release sealed them) keep
	// filters of their own beside the sliced ones.
	old := len(j.idx.segs)
	sealAt = 96
	j, _ = reopen(t, j, o)
	slotted("another shape", 0)
	write(3 * sealAt)
	if len(j.idx.segs) < old+3 {
		t.Fatalf("%d segments, want %d more than %d", len(j.idx.segs), 3, old)
	}
	slotted("another shape", len(j.idx.segs)-old)
	check("another shape", 0)
	sealAt = 64
	j, _ = reopen(t, j, o)
	slotted("shape back", old)

	// Retention drops the oldest hand-offs, and with them the oldest
	// segments and their slots.
	cut := len(keys) / 2
	clock.Advance(2 * time.Hour)
	for _, k := range keys[cut:] {
		appendOK(t, j, k, Record{Kind: Released, At: clock.Now()})
	}
	appendOK(t, j, again, Record{Kind: Released, At: clock.Now()})
	if _, err := j.Compact(); err != nil {
		t.Fatal(err)
	}
	if len(j.idx.segs) >= old {
		t.Fatalf("%d segments after retention, want fewer than %d", len(j.idx.segs), old)
	}
	n := 0
	for _, g := range j.idx.segs {
		if g.slot != nil {
			n++
		}
	}
	slotted("after retention", n)
	check("after retention", cut)

	// The dropped segments are gone from the file too.
	kept := len(j.idx.segs)
	j, _ = reopen(t, j, o)
	if len(j.idx.segs) != kept {
		t.Fatalf("%d segments after a reopen, want the %d retention kept", len(j.idx.segs), kept)
	}
	slotted("after retention, reopened", n)
}
