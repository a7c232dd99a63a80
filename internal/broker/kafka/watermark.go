package kafka

import (
	"cmp"
	"slices"
	"sync"
)

// watermark tracks the records of one partition handed out and not yet
// settled, and the offset that may be committed: the first one not settled.
// It is safe for concurrent use.
type watermark struct {
	mu      sync.Mutex
	pending []mark // in offset order
	next    int64  // the committable offset: all before it are settled
	epoch   int32
	seen    bool // a record was tracked: next means something
}

type mark struct {
	offset  int64
	settled bool
}

// track records that offset was handed out. Offsets arrive in order.
func (w *watermark) track(offset int64, epoch int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pending) == 0 && offset >= w.next {
		w.next = offset // nothing in flight: the watermark sits at this record
	}
	w.pending = append(w.pending, mark{offset: offset})
	w.epoch = epoch
	w.seen = true
}

// peek returns the committable offset as it would stand with the offsets in
// also settled, without settling them; ok is false before any record was
// tracked.
func (w *watermark) peek(also map[int64]bool) (next int64, epoch int32, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	next = w.next
	for _, m := range w.pending {
		if !m.settled && !also[m.offset] {
			break
		}
		next = m.offset + 1
	}
	return next, w.epoch, w.seen
}

// settle marks offset done and returns the new committable offset and
// whether it moved.
func (w *watermark) settle(offset int64) (int64, int32, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// In offset order: found by halving, not by a walk over every record
	// in flight.
	if i, ok := slices.BinarySearchFunc(w.pending, offset, func(m mark, o int64) int { return cmp.Compare(m.offset, o) }); ok {
		w.pending[i].settled = true
	}
	moved := false
	for len(w.pending) > 0 && w.pending[0].settled {
		w.next = w.pending[0].offset + 1
		w.pending = w.pending[1:]
		moved = true
	}
	return w.next, w.epoch, moved
}
