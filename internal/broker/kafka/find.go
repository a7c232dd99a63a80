package kafka

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
)

// findTimeout bounds the read-back of one destination.
const findTimeout = 30 * time.Second

// FindCopy reports whether a copy with trail's event id, replay id and hop
// already reached dest, written since about since. Unlike a queue, a topic
// can be read back: after a crash between producing a copy and recording its
// acknowledgement, the copy is looked for instead of produced a second time.
func (c *Client) FindCopy(ctx context.Context, dest broker.Destination, trail broker.Headers, since time.Time) (bool, error) {
	want, err := broker.CopyIdentity(trail)
	if err != nil {
		return false, err
	}
	topic := DeadLetterTopic(c.o.Topic, c.o.Group)
	if !dest.DeadLetter {
		topic = RetryTopic(c.o.Topic, c.o.Group, dest.Tier)
	}
	ctx, cancel := context.WithTimeout(ctx, findTimeout)
	defer cancel()
	adm := kadm.NewClient(c.cl)
	// A second of slack for clocks: the record's timestamp is the
	// producer's, the same clock as since.
	starts, err := adm.ListOffsetsAfterMilli(ctx, since.Add(-time.Second).UnixMilli(), topic)
	if err != nil {
		return false, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	// Read committed, up to the last stable offset: a copy of an aborted
	// transaction does not count. Control records are kept so the reading
	// reaches that offset even when the last record before it is one.
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return false, fmt.Errorf("list stable offsets of %s: %w", topic, err)
	}
	from := map[int32]kgo.Offset{}
	left := map[int32]int64{} // partition → end offset still to reach
	starts.Each(func(o kadm.ListedOffset) {
		end, ok := ends.Lookup(topic, o.Partition)
		if o.Err == nil && ok && end.Err == nil && o.Offset >= 0 && o.Offset < end.Offset {
			from[o.Partition] = kgo.NewOffset().At(o.Offset)
			left[o.Partition] = end.Offset
		}
	})
	if len(from) == 0 {
		return false, nil
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(c.o.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	}, c.o.Extra...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return false, err
	}
	defer cl.Close()
	for len(left) > 0 {
		f := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return false, fmt.Errorf("read back %s: %w", topic, err)
		}
		found := false
		f.EachRecord(func(r *kgo.Record) {
			var got [3]string
			for _, h := range r.Headers {
				switch h.Key {
				case broker.HeaderEventID:
					got[0] = string(h.Value)
				case broker.HeaderReplayID:
					got[1] = string(h.Value)
				case broker.HeaderHops:
					got[2] = string(h.Value)
				}
			}
			if got == want {
				found = true
			}
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
		})
		if found {
			return true, nil
		}
	}
	return false, nil
}
