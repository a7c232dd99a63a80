package journal

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/testkit"
)

// With SyncAlways every Append is its own transaction, but the records
// queued by AppendAsync before it ride along instead of costing a
// transaction (and an fsync) each.
func TestAlwaysCarriesAsyncRecordsWithTheNextAppend(t *testing.T) {
	var txs atomic.Int32
	release := make(chan struct{})
	var once sync.Once
	j, _ := openJournal(t, newPath(t), Options{Sync: SyncAlways, BeforeCommit: func(int) error {
		if txs.Add(1) == 1 {
			<-release // hold the writer so that the rest queues up
		}
		return nil
	}})
	t.Cleanup(func() { once.Do(func() { close(release) }) })

	done := make(chan struct{})
	go func() {
		defer close(done)
		appendOK(t, j, Key{Source: "first"}, Record{Kind: Received})
	}()
	testkit.Eventually(t, 10*time.Second, "the condition", func() bool { return txs.Load() == 1 })
	for i := range 50 {
		j.AppendAsync(Key{Source: "async", EventID: string(rune('a' + i))}, Record{Kind: Received})
	}
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		appendOK(t, j, Key{Source: "waited"}, Record{Kind: Received})
	}()
	testkit.Eventually(t, 10*time.Second, "the condition", func() bool { return len(j.reqs) == 51 })
	once.Do(func() { close(release) })
	<-done
	<-waited
	if got := txs.Load(); got != 2 {
		t.Errorf("%d transactions, want 2: the first Append, then the 50 async records with the next Append", got)
	}
}
