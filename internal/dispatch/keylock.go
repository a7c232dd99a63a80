package dispatch

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"

	"handoff.dev/handoff/internal/journal"
)

// keyLocks lets one delivery of a hand-off run at a time: two copies of one
// event in flight together would each read the journal before the other
// wrote to it. The second waits, then finds the first's records.
//
// Every walk locks its key once and unlocks it once, from any of its
// goroutines: the locks are split in shards by the key's hash, each with a
// mutex and a map of its own keyed by the hash, so that walks on the cores
// seldom meet on one mutex and a look-up hashes the key once. Two keys
// that share a hash share a lock: one waits for the other, which costs
// time, never a wrong answer.
type keyLocks struct {
	seed   maphash.Seed
	shards [keyShards]keyShard
}

// keyShards is how many shards the locks are split in: a power of two,
// several times the cores a sidecar is given.
const keyShards = 32

type keyShard struct {
	mu sync.Mutex
	m  map[uint64]*keyLock
	// free holds locks no key uses, for the next keys: nearly every key is
	// locked once, and a lock made for each would be two allocations a
	// message.
	free []*keyLock
	_    [64]byte // a shard's mutex on a cache line of its own
}

// maxFreeKeyLocks bounds the locks kept for reuse, over all shards: more
// than the walks in flight at once is memory for nothing.
const maxFreeKeyLocks = 1024

// keyLock is one key's lock. Its state is under its shard's mu: a lock
// taken and given back by one walk, the usual case, costs the shard's mutex
// twice and nothing else; only a second walk of the key waits, on a channel
// of its own, which the holder's unlock closes to hand the lock over.
type keyLock struct {
	held    bool
	waiters []chan struct{} // in arrival order; each is handed the lock in turn
	refs    int             // the holder and those waiting
	h       uint64          // the hash it is locked under
	shard   *keyShard
}

func newKeyLocks() *keyLocks {
	l := &keyLocks{seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].m = make(map[uint64]*keyLock)
	}
	return l
}

// lock waits for k until ctx is done; unlock with the lock it returns
// releases it. contended, when not nil, is called before a wait, when
// another holds k.
func (l *keyLocks) lock(ctx context.Context, k journal.Key, contended func()) (*keyLock, error) {
	h := l.hash(k)
	s := &l.shards[h%keyShards]
	s.mu.Lock()
	kl := s.m[h]
	if kl == nil {
		if n := len(s.free); n > 0 {
			kl, s.free[n-1] = s.free[n-1], nil
			s.free = s.free[:n-1]
		} else {
			kl = &keyLock{shard: s}
		}
		kl.h = h
		s.m[h] = kl
	}
	kl.refs++
	if !kl.held {
		kl.held = true
		s.mu.Unlock()
		return kl, nil
	}
	turn := make(chan struct{})
	kl.waiters = append(kl.waiters, turn)
	s.mu.Unlock()
	if contended != nil {
		contended()
	}
	select {
	case <-turn:
		return kl, nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if i := slices.Index(kl.waiters, turn); i >= 0 {
		// Still waiting: it leaves the queue.
		kl.waiters = slices.Delete(kl.waiters, i, i+1)
		l.releaseLocked(kl)
		s.mu.Unlock()
		return nil, ctx.Err()
	}
	s.mu.Unlock()
	// Handed the lock as ctx ended: passed on to the next.
	l.unlock(kl)
	return nil, ctx.Err()
}

// hash is k's hash: its event id's, and its replay id's when it has one.
// The source is left out: keys of two sources that share an event id
// share a lock, which the rare case can afford.
func (l *keyLocks) hash(k journal.Key) uint64 {
	h := maphash.String(l.seed, k.EventID)
	if k.ReplayID != "" {
		h ^= maphash.String(l.seed, k.ReplayID) * 0x9e3779b97f4a7c15
	}
	return h
}

// unlock releases kl, which lock returned: to the first walk waiting for
// it, if any.
func (l *keyLocks) unlock(kl *keyLock) {
	s := kl.shard
	s.mu.Lock()
	if len(kl.waiters) > 0 {
		next := kl.waiters[0]
		kl.waiters[0] = nil
		kl.waiters = kl.waiters[1:]
		close(next) // held from here on by that waiter
	} else {
		kl.held = false
	}
	l.releaseLocked(kl)
	s.mu.Unlock()
}

// releaseLocked drops one reference to kl; its shard's mu is held.
func (l *keyLocks) releaseLocked(kl *keyLock) {
	s := kl.shard
	kl.refs--
	if kl.refs == 0 {
		// No one holds it or waits for it: it is as good as new.
		delete(s.m, kl.h)
		kl.waiters = kl.waiters[:0]
		if len(s.free) < maxFreeKeyLocks/keyShards {
			s.free = append(s.free, kl)
		}
	}
}

// counts is how many keys are locked and how many locks are free.
func (l *keyLocks) counts() (locked, free int) {
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		locked, free = locked+len(s.m), free+len(s.free)
		s.mu.Unlock()
	}
	return locked, free
}
