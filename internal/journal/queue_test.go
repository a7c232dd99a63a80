package journal

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/testkit"
)

// TestAsyncRecordsQueueThroughAStalledCommit: while the disk holds a commit
// up, the hand-offs of a full Kafka window go on queueing their attempt and
// outcome records without waiting (the attempt record is queued before the
// app's call, so a wait there holds the call), and every record lands once
// the commit ends.
func TestAsyncRecordsQueueThroughAStalledCommit(t *testing.T) {
	j, resume := stalledCommit(t, Options{Sync: SyncNone})

	// A window of 256 records and 16 times as many answered ones waiting
	// for their commit, each with two requests: more than the 4 batches the
	// queue once held.
	const handoffs = 256 + 16*256
	var queued atomic.Int64
	go func() {
		for i := range handoffs {
			k := Key{Source: "s", EventID: strconv.Itoa(i)}
			j.AppendAsync(k, Record{Kind: Received}, Record{Kind: Attempt, Attempt: 1})
			j.AppendAsync(k, Record{Kind: Outcome, Attempt: 1, Outcome: outSuccess, Status: 200}, Record{Kind: Settled, Detail: "handled"})
			queued.Add(1)
		}
	}()
	if !testkit.Wait(10*time.Second, func() bool { return queued.Load() == handoffs }) {
		t.Fatalf("%d of %d hand-offs queued their records while a commit was held up; the rest waited for it", queued.Load(), handoffs)
	}
	resume()
	appendOK(t, j, Key{Source: "s", EventID: "last"}, Record{Kind: Received})
	for _, i := range []int{0, handoffs / 2, handoffs - 1} {
		var kinds []Kind
		for _, s := range timeline(t, j, Key{Source: "s", EventID: strconv.Itoa(i)}) {
			kinds = append(kinds, s.Kind)
		}
		if want := []Kind{Received, Attempt, Outcome, Settled}; !equalKinds(kinds, want) {
			t.Errorf("hand-off %d: timeline %v, want %v", i, kinds, want)
		}
	}
}
