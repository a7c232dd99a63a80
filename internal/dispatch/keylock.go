package dispatch

import (
	"context"
	"hash/maphash"
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

type keyLock struct {
	held  chan struct{} // a token: full while held
	refs  int           // the holder and those waiting; under the shard's mu
	h     uint64        // the hash it is locked under
	shard *keyShard
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
			kl = &keyLock{held: make(chan struct{}, 1), shard: s}
		}
		kl.h = h
		s.m[h] = kl
	}
	kl.refs++
	s.mu.Unlock()
	select {
	case kl.held <- struct{}{}:
		return kl, nil
	default:
	}
	if contended != nil {
		contended()
	}
	select {
	case kl.held <- struct{}{}:
		return kl, nil
	case <-ctx.Done():
		l.release(kl)
		return nil, ctx.Err()
	}
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

// unlock releases kl, which lock returned.
func (l *keyLocks) unlock(kl *keyLock) {
	<-kl.held
	l.release(kl)
}

func (l *keyLocks) release(kl *keyLock) {
	s := kl.shard
	s.mu.Lock()
	kl.refs--
	if kl.refs == 0 {
		// No one holds it or waits for it: its token is out, so it is as
		// good as new.
		delete(s.m, kl.h)
		if len(s.free) < maxFreeKeyLocks/keyShards {
			s.free = append(s.free, kl)
		}
	}
	s.mu.Unlock()
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
