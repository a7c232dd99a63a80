package journal

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// indexed counts the keys in the ids bucket of j's file.
func indexed(t *testing.T, j *Journal) int {
	t.Helper()
	n := 0
	if err := j.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketIDs).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// mergedUpTo is the file's metaMerged.
func mergedUpTo(t *testing.T, j *Journal) uint64 {
	t.Helper()
	var v uint64
	if err := j.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketMeta).Get(metaMerged); len(b) == 8 {
			v = binary.BigEndian.Uint64(b)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// otherKey is a hand-off of its own whose records make commits happen.
var otherKey = Key{Source: "orders", EventID: "other"}

// randomKey is the i-th of a set of keys spread like UUIDs.
func randomKey(i int) Key {
	v := uint64(i) * 0x9e3779b97f4a7c15
	return Key{Source: "orders", EventID: fmt.Sprintf("%016x-%016x", v, v^0x5851f42d4c957f2d)}
}

// settleAll writes a settled hand-off of each of n keys, one Append each.
func settleAll(t *testing.T, j *Journal, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		appendOK(t, j, randomKey(i), storySettledSuccess(at(time.Duration(i)*time.Millisecond))...)
	}
}

// checkFound fails unless every one of keys 0..n-1 has its whole history.
func checkFound(t *testing.T, j *Journal, n int) {
	t.Helper()
	for i := range n {
		s, err := j.State(randomKey(i))
		if err != nil || !s.Found || !s.Handled() || !s.Settled {
			t.Fatalf("key %d: %+v, %v", i, s, err)
		}
	}
}

// New keys wait in memory and are merged into the ids bucket in chunks that
// ride on later commits; every key is found throughout, and after a restart
// (which merges nothing) the keys not yet merged are read back from their
// first records.
func TestKeyIndexMergesLaterAndSurvivesRestart(t *testing.T) {
	path := newPath(t)
	o := Options{mergeAt: 100, mergeEvery: time.Hour}
	j, _ := openJournal(t, path, o)
	settleAll(t, j, 0, 1000)
	checkFound(t, j, 1000)
	in, waiting := indexed(t, j), j.recent.size()
	t.Logf("after 1000 hand-offs: %d keys in the bucket, %d waiting in memory", in, waiting)
	if in == 0 || in+waiting < 1000 || waiting >= 1000 {
		t.Fatalf("%d keys in the bucket and %d in memory, of 1000", in, waiting)
	}
	if mergedUpTo(t, j) == 0 {
		t.Fatal("no merge finished: metaMerged not moved")
	}
	// Some keys are in memory only when the journal closes.
	settleAll(t, j, 1000, 50)
	if j.recent.size() == 0 {
		t.Fatal("nothing waiting in memory: the restart would prove nothing")
	}
	j, _ = reopen(t, j, o)
	checkFound(t, j, 1050)
	if got := timeline(t, j, randomKey(1049)); len(got) != len(storySettledSuccess(t0)) {
		t.Fatalf("timeline of a key read back: %d steps", len(got))
	}
	if ev, err := j.Event("orders", randomKey(1049).EventID); err != nil || len(ev) != 1 {
		t.Fatalf("Event of a key read back: %d timelines, %v", len(ev), err)
	}
	if ev, err := j.Event("orders", randomKey(3).EventID); err != nil || len(ev) != 1 {
		t.Fatalf("Event of a merged key: %d timelines, %v", len(ev), err)
	}
	// A read-only open sees them too.
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	ro, _ := openJournal(t, path, Options{ReadOnly: true})
	checkFound(t, ro, 1050)
}

// A hand-off removed (retention) before its key was merged does not come
// back into the index with the merge.
func TestKeyIndexMergeSkipsRemovedHandoffs(t *testing.T) {
	clock := newFakeClock()
	j, _ := openJournal(t, newPath(t), Options{Now: clock.Now, Retention: time.Hour, mergeAt: 1 << 30, mergeEvery: time.Hour})
	for i := range 20 {
		appendOK(t, j, randomKey(i), storySettledSuccess(clock.Now())...)
	}
	clock.Advance(2 * time.Hour)
	if n, err := j.Compact(); err != nil || n != 20 {
		t.Fatalf("Compact: %d, %v", n, err)
	}
	if j.recent.size() != 0 {
		t.Fatalf("%d removed keys still in memory", j.recent.size())
	}
	// New ones, and a merge of everything waiting.
	for i := 20; i < 30; i++ {
		appendOK(t, j, randomKey(i), storySettledSuccess(clock.Now())...)
	}
	j.o.mergeAt = 1
	appendOK(t, j, otherKey, Record{Kind: Received})
	if got := indexed(t, j); got != 10 {
		t.Fatalf("%d keys in the bucket, want the 10 kept", got)
	}
	for i := range 20 {
		if s, err := j.State(randomKey(i)); err != nil || s.Found {
			t.Fatalf("removed key %d found: %+v, %v", i, s, err)
		}
	}
}

// A journal written before the index was merged later has every key in the
// bucket and no metaMerged: opening it adds one, and finds every key.
func TestKeyIndexOfAnEarlierJournal(t *testing.T) {
	path := newPath(t)
	j, _ := openJournal(t, path, Options{mergeAt: 1, mergeEvery: time.Nanosecond})
	settleAll(t, j, 0, 200)
	// Commits until every key is in the bucket, as an earlier version kept it.
	for j.recent.size() > 0 {
		appendOK(t, j, otherKey, Record{Kind: Received})
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	updateFile(t, path, func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(metaMerged) })
	j, _ = openJournal(t, path, Options{})
	if got := mergedUpTo(t, j); got != 201 {
		t.Fatalf("metaMerged = %d after open, want 201 (every id)", got)
	}
	checkFound(t, j, 200)
	// Keys written from now on wait in memory and survive a restart.
	settleAll(t, j, 200, 10)
	j, _ = reopen(t, j, Options{})
	checkFound(t, j, 210)
}
