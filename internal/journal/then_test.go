package journal

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// AppendThen calls back once the records are durable, in commit order, and
// a callback may append: its records land, and Close waits for every
// callback.
func TestAppendThenCallsBackAfterTheCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j, _, err := Open(path, testOptions(Options{Sync: SyncBatch}))
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		k := Key{Source: "s", EventID: fmt.Sprint(i)}
		j.AppendThen(k, ThenFunc(func(err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("event %d: %v", i, err)
				return
			}
			// Durable by now: the index shows it to a reader.
			st, err := j.State(k)
			if err != nil || !st.Found || st.Last.Kind != Received {
				t.Errorf("event %d in its callback: found %v, last %v, err %v; want the record appended", i, st.Found, st.Last.Kind, err)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			j.AppendAsync(k, Record{Kind: Settled, Detail: "handled"})
		}), Record{Kind: Received})
	}
	wg.Wait()
	for i := range order {
		if order[i] != i {
			t.Fatalf("callbacks out of order: %v…", order[:min(len(order), i+3)])
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j, _, err = Open(path, testOptions(Options{Sync: SyncBatch}))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for i := range n {
		st, err := j.State(Key{Source: "s", EventID: fmt.Sprint(i)})
		if err != nil || !st.Settled || st.Last.Kind != Settled {
			t.Fatalf("event %d after reopening: settled %v, last %v, err %v; want the settle its callback appended", i, st.Settled, st.Last.Kind, err)
		}
	}
}

// A journal that refuses records calls back at once, with why.
func TestAppendThenOnAClosedJournal(t *testing.T) {
	j, _, err := Open(filepath.Join(t.TempDir(), "journal.db"), testOptions(Options{Sync: SyncBatch}))
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	var got error
	j.AppendThen(Key{Source: "s", EventID: "e"}, ThenFunc(func(err error) { got = err }), Record{Kind: Received})
	if !errors.Is(got, ErrClosed) {
		t.Fatalf("callback on a closed journal: %v, want ErrClosed", got)
	}
}
