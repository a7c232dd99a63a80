package deadletter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// errFound stops a read at the message looked for.
var errFound = errors.New("found")

// Message reads dead letter id's DLQ entry from src: its body, key and
// headers, which the index does not keep. It returns ErrNotFound when the
// entry is no longer in the log (retention removed it) or not yet.
func Message(ctx context.Context, src Source, id ID) (*broker.Message, error) {
	if id.Log != src.DLQ.Name() {
		return nil, fmt.Errorf("%w: %s is not in %s", ErrNotFound, id, src.DLQ.Name())
	}
	// Only id's partition is read: the others start past their end.
	first, err := src.DLQ.First(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", id, err)
	}
	from := map[int32]int64{}
	for p := range first {
		from[p] = math.MaxInt64
	}
	from[id.Partition] = id.Offset
	var got *broker.Message
	err = src.DLQ.Read(ctx, from, func(p int32, off int64, _ time.Time, m *broker.Message) error {
		if p != id.Partition {
			return nil // a log reads every partition; only one is wanted
		}
		if off == id.Offset {
			got = m
		}
		return errFound // the first message read is at or past the offset
	})
	if err != nil && !errors.Is(err, errFound) {
		return nil, fmt.Errorf("read %s: %w", id, err)
	}
	if got == nil {
		return nil, fmt.Errorf("%w: %s is not in the log", ErrNotFound, id)
	}
	return got, nil
}

// Messages reads the DLQ entries of ids, all of one source, in one read of
// the log: from the lowest offset asked of each partition to the highest.
// An entry no longer in the log (or not yet) is left out of the answer.
func Messages(ctx context.Context, src Source, ids []ID) (map[ID]*broker.Message, error) {
	out := map[ID]*broker.Message{}
	if len(ids) == 0 {
		return out, nil
	}
	first, err := src.DLQ.First(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", src.DLQ.Name(), err)
	}
	from := map[int32]int64{}
	for p := range first {
		from[p] = math.MaxInt64
	}
	last := map[int32]int64{}
	wanted := map[ID]bool{}
	for _, id := range ids {
		if id.Log != src.DLQ.Name() {
			return nil, fmt.Errorf("%w: %s is not in %s", ErrNotFound, id, src.DLQ.Name())
		}
		wanted[id] = true
		if f, ok := from[id.Partition]; !ok || id.Offset < f {
			from[id.Partition] = id.Offset
		}
		last[id.Partition] = max(last[id.Partition], id.Offset)
	}
	done := map[int32]bool{}
	err = src.DLQ.Read(ctx, from, func(p int32, off int64, _ time.Time, m *broker.Message) error {
		end, ok := last[p]
		if !ok || done[p] {
			return nil
		}
		if id := (ID{Log: src.DLQ.Name(), Partition: p, Offset: off}); wanted[id] {
			out[id] = m
		}
		if off >= end {
			done[p] = true
			if len(done) == len(last) {
				return errFound
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		return nil, fmt.Errorf("read %s: %w", src.DLQ.Name(), err)
	}
	return out, nil
}
