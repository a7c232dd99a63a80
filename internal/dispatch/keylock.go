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
}

type keyLock struct {
	held chan struct{} // a token: full while held
	refs int
}

func newKeyLocks() *keyLocks { return &keyLocks{m: make(map[journal.Key]*keyLock)} }

// lock waits for k until ctx is done; the returned func releases it.
func (l *keyLocks) lock(ctx context.Context, k journal.Key) (func(), error) {
	l.mu.Lock()
	kl := l.m[k]
	if kl == nil {
		kl = &keyLock{held: make(chan struct{}, 1)}
		l.m[k] = kl
	}
	kl.refs++
	l.mu.Unlock()
	select {
	case kl.held <- struct{}{}:
		return func() { <-kl.held; l.release(k, kl) }, nil
	case <-ctx.Done():
		l.release(k, kl)
		return nil, ctx.Err()
	}
}

func (l *keyLocks) release(k journal.Key, kl *keyLock) {
	l.mu.Lock()
	kl.refs--
	if kl.refs == 0 {
		delete(l.m, k)
	}
	l.mu.Unlock()
}
