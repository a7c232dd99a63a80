package journal

import (
	"context"
	"errors"
	"syscall"
)

// A journal whose disk has no room (full, over a quota or a file size
// limit, read-only) fails the commits that need it and goes on: see
// ErrNoRoom. The writer keeps the latest such failure until a commit
// succeeds; Probe commits nothing, to learn when one can.

// noRoom reports whether err is a failed write for want of room, which
// freeing space (or remounting read-write) cures.
func noRoom(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		errors.Is(err, syscall.EFBIG) || errors.Is(err, syscall.EROFS)
}

// NoRoom is the latest commit's failure for want of room (ErrNoRoom), or
// nil when the latest commit succeeded: what a readiness check reports.
func (j *Journal) NoRoom() error {
	j.failMu.Lock()
	defer j.failMu.Unlock()
	return j.full
}

// Probe commits a transaction that writes no record, through the writer
// like every commit, and returns its error: after ErrNoRoom, nil says the
// journal can be written again.
func (j *Journal) Probe(ctx context.Context) error {
	return j.await(ctx, &request{probe: true, done: make(chan error, 1)})
}
