package dispatch

import (
	"context"
	"sync"

	"handoff.dev/handoff/internal/journal"
)

// keyLocks lets one delivery of a hand-off run at a time: two copies of one
// event in flight together would each read the journal before the other
// wrote to it. The second waits, then finds the first's records.
type keyLocks struct {
	mu sync.Mutex
	m  map[journal.Key]*keyLock
	// free holds locks no key uses, for the next keys: nearly every key is
	// locked once, and a lock made for each would be two allocations a
	// message.
	free []*keyLock
}

// maxFreeKeyLocks bounds the locks kept for reuse: more than the walks in
// flight at once is memory for nothing.
const maxFreeKeyLocks = 1024

type keyLock struct {
	held chan struct{} // a token: full while held
	refs int           // the holder and those waiting; under keyLocks.mu
}

func newKeyLocks() *keyLocks { return &keyLocks{m: make(map[journal.Key]*keyLock)} }

// lock waits for k until ctx is done; unlock with the lock it returns
// releases it. contended, when not nil, is called before a wait, when
// another holds k.
func (l *keyLocks) lock(ctx context.Context, k journal.Key, contended func()) (*keyLock, error) {
	l.mu.Lock()
	kl := l.m[k]
	if kl == nil {
		if n := len(l.free); n > 0 {
			kl, l.free[n-1] = l.free[n-1], nil
			l.free = l.free[:n-1]
		} else {
			kl = &keyLock{held: make(chan struct{}, 1)}
		}
		l.m[k] = kl
	}
	kl.refs++
	l.mu.Unlock()
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
		l.release(k, kl)
		return nil, ctx.Err()
	}
}

// unlock releases k, which kl holds.
func (l *keyLocks) unlock(k journal.Key, kl *keyLock) {
	<-kl.held
	l.release(k, kl)
}

func (l *keyLocks) release(k journal.Key, kl *keyLock) {
	l.mu.Lock()
	kl.refs--
	if kl.refs == 0 {
		// No one holds it or waits for it: its token is out, so it is as
		// good as new.
		delete(l.m, k)
		if len(l.free) < maxFreeKeyLocks {
			l.free = append(l.free, kl)
		}
	}
	l.mu.Unlock()
}
