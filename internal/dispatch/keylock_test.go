package dispatch

import (
	"context"
	"runtime"
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

// Many walks on few keys, some giving up while they wait: one holder of a
// key at a time, every lock handed on or given back (none left locked),
// and a waiter whose wait ends as the lock is handed to it passes it on.
func TestKeyLocksUnderContention(t *testing.T) {
	l := newKeyLocks()
	const keys, walkers, rounds = 3, 16, 300
	var holders [keys]atomic.Int32
	var taken, gaveUp atomic.Int64
	done := make(chan struct{})
	for w := range walkers {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range rounds {
				k := (w + i) % keys
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if i%3 == 0 {
					// Gives up soon: often while the lock is being handed to it.
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(i%50)*time.Microsecond)
				}
				kl, err := l.lock(ctx, journal.Key{Source: "s", EventID: strconv.Itoa(k)}, nil)
				cancel()
				if err != nil {
					gaveUp.Add(1)
					continue
				}
				if n := holders[k].Add(1); n != 1 {
					t.Errorf("key %d held by %d walks at once", k, n)
				}
				taken.Add(1)
				// Held for a while, yielding, so that others queue behind
				// it and the impatient among them give up waiting.
				hold := time.Duration(i%2) * 20 * time.Microsecond
				for start := time.Now(); time.Since(start) < hold; {
					runtime.Gosched()
				}
				runtime.Gosched()
				holders[k].Add(-1)
				l.unlock(kl)
			}
		}()
	}
	for range walkers {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("walks stuck on their keys' locks: a lock was never handed on")
		}
	}
	if n, _ := l.counts(); n != 0 {
		t.Errorf("%d keys still locked after every walk unlocked or gave up", n)
	}
	t.Logf("%d locks taken, %d waits given up", taken.Load(), gaveUp.Load())
	if taken.Load() == 0 || gaveUp.Load() == 0 {
		t.Errorf("taken %d, given up %d: the test exercised neither a hand-over nor a give-up", taken.Load(), gaveUp.Load())
	}
}
