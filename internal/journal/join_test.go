package journal

import (
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestJoinedParts: records of one hand-off queued by several requests that
// land in one commit are written as one part, in the order queued, unless
// they would make a part too large; other hand-offs' parts between them are
// unaffected.
func TestJoinedParts(t *testing.T) {
	// What is queued while the writer is held inside a commit is the next
	// batch, all of it.
	j, resume := stalledCommit(t, Options{Sync: SyncNone})

	a, b := Key{Source: "s", EventID: "a"}, Key{Source: "s", EventID: "b"}
	big := strings.Repeat("x", maxJoin)
	j.AppendAsync(a, Record{Kind: Received}, Record{Kind: Attempt, Attempt: 1})
	j.AppendAsync(b, Record{Kind: Received})
	j.AppendAsync(a, Record{Kind: Outcome, Attempt: 1, Outcome: outSuccess, Status: 200})
	j.AppendAsync(b, Record{Kind: Attempt, Attempt: 1})
	j.AppendAsync(a, Record{Kind: Outcome, Attempt: 1, Outcome: outSuccess, Detail: big}) // too large to join
	j.AppendAsync(a, Record{Kind: Settled, Detail: "handled"})
	resume()
	appendOK(t, j, Key{Source: "s", EventID: "last"}, Record{Kind: Received})

	var kinds []Kind
	for _, s := range timeline(t, j, a) {
		kinds = append(kinds, s.Kind)
	}
	if want := []Kind{Received, Attempt, Outcome, Outcome, Settled}; !equalKinds(kinds, want) {
		t.Errorf("timeline of a = %v, want %v", kinds, want)
	}
	kinds = kinds[:0]
	for _, s := range timeline(t, j, b) {
		kinds = append(kinds, s.Kind)
	}
	if want := []Kind{Received, Attempt}; !equalKinds(kinds, want) {
		t.Errorf("timeline of b = %v, want %v", kinds, want)
	}

	// first, a's first three records, b's two, a's large outcome, a's
	// settle (not joined to the large one), last: six parts, not eight.
	parts := 0
	if err := j.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLog).ForEach(func(_, v []byte) error {
			partsOf(v, func(_ int, body []byte, err error) bool {
				if err != nil {
					t.Errorf("reading a part: %v", err)
				}
				if body != nil {
					parts++
				}
				return true
			})
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if parts != 6 {
		t.Errorf("%d parts in the log, want 6", parts)
	}
}

func equalKinds(a, b []Kind) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
