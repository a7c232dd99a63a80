package dispatch

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"handoff.dev/handoff/internal/journal"
)

// A second delivery of one key waits for the first to unlock; a lock given
// up by its waiter, or unlocked by its last holder, leaves nothing behind,
// and a lock taken back from the free ones is not held. The walk told of
// a wait is the one that waits (it gives back its call's slot first).
func TestKeyLocks(t *testing.T) {
	l := newKeyLocks()
	a := journal.Key{Source: "s", EventID: "a"}
	var contended atomic.Int32
	onWait := func() { contended.Add(1) }
	first, err := l.lock(context.Background(), a, onWait)
	if err != nil {
		t.Fatal(err)
	}
	if n := contended.Load(); n != 0 {
		t.Fatalf("a free key's lock called contended %d times, want none", n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.lock(ctx, a, nil); err == nil {
		t.Fatal("a second lock of a held key did not wait")
	}

	got := make(chan *keyLock)
	waiting := make(chan struct{})
	go func() {
		kl, _ := l.lock(context.Background(), a, func() { onWait(); close(waiting) })
		got <- kl
	}()
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the second lock of a held key never said it waits")
	}
	select {
	case <-got:
		t.Fatal("the second lock was taken while the first was held")
	default:
	}
	if n := contended.Load(); n != 1 {
		t.Fatalf("contended called %d times, want once: by the second lock", n)
	}
	l.unlock(first)
	second := <-got
	l.unlock(second)

	if n, free := l.counts(); n != 0 || free != 1 {
		t.Fatalf("%d keys locked and %d locks free after every unlock, want 0 and 1", n, free)
	}
	// The freed lock serves the next key of its shard, and is free for it.
	b := journal.Key{Source: "s", EventID: "b"}
	for i := 0; first.shard != &l.shards[l.hash(b)%keyShards]; i++ {
		b.EventID = "b" + strconv.Itoa(i)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kl, err := l.lock(ctx, b, nil)
	if err != nil || kl != first {
		t.Fatalf("lock of a new key = %p, %v; want the freed lock %p, taken at once", kl, err, first)
	}
	l.unlock(kl)
}
