package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// TierLag is the group's lag on one retry tier's topic.
type TierLag struct {
	Tier  time.Duration
	Topic string
	// Lag is the records past the group's committed offsets, over every
	// partition: copies waiting to be due, and those in flight. A partition
	// the group never committed counts from its start. In offsets: with
	// transactional transfers, commit markers count too.
	Lag int64
}

// RetryLag reads the group's lag on each retry topic, in tier order: the
// group's committed offsets and the topics' start and end offsets, three
// requests however many tiers. It is safe for concurrent use.
func (c *Client) RetryLag(ctx context.Context) ([]TierLag, error) {
	topics := make([]string, len(c.o.Tiers))
	for i, t := range c.o.Tiers {
		topics[i] = RetryTopic(c.o.Topic, c.o.Group, t)
	}
	if len(topics) == 0 {
		return nil, nil
	}
	adm := kadm.NewClient(c.cl)
	committed, err := groupOffsets(ctx, adm, c.group)
	if err != nil {
		return nil, err
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list start offsets: %w", err)
	}
	out := make([]TierLag, len(topics))
	for i, topic := range topics {
		out[i] = TierLag{Tier: c.o.Tiers[i], Topic: topic}
	}
	index := make(map[string]int, len(topics))
	for i, topic := range topics {
		index[topic] = i
	}
	var failed error
	ends.Each(func(end kadm.ListedOffset) {
		i, ok := index[end.Topic]
		if !ok {
			return
		}
		if end.Err != nil {
			failed = fmt.Errorf("end offset of %s[%d]: %w", end.Topic, end.Partition, end.Err)
			return
		}
		out[i].Lag += partitionLag(end, committed, starts, -1)
	})
	if failed != nil {
		return nil, failed
	}
	return out, nil
}

// Backlog reads the source topic's backlog — the records past the group's
// committed offsets, over every partition, less those this member settled
// since its latest commit; for a share group, those its brokers count as
// not yet acknowledged — and the sum of the topic's end offsets: what was
// ever produced to it, whose growth is the arrival rate.
func (c *Client) Backlog(ctx context.Context) (lag, produced int64, err error) {
	adm := kadm.NewClient(c.cl)
	lagOf := c.groupLag
	if c.share != nil {
		lagOf = c.shareLag
	}
	partLag, err := lagOf(ctx, adm)
	if err != nil {
		return 0, 0, err
	}
	ends, err := adm.ListEndOffsets(ctx, c.o.Topic)
	if err != nil {
		return 0, 0, fmt.Errorf("list end offsets: %w", err)
	}
	starts, err := adm.ListStartOffsets(ctx, c.o.Topic)
	if err != nil {
		return 0, 0, fmt.Errorf("list start offsets: %w", err)
	}
	var failed error
	ends.Each(func(end kadm.ListedOffset) {
		if end.Err != nil {
			failed = fmt.Errorf("end offset of %s[%d]: %w", end.Topic, end.Partition, end.Err)
			return
		}
		produced += end.Offset
		lag += partLag(end, starts)
	})
	return lag, produced, failed
}

// groupOffsets reads a group's committed offsets. A group the broker does
// not know yet (kfake makes one only when a member joins) has committed
// nothing, which is no error for a lag.
func groupOffsets(ctx context.Context, adm *kadm.Client, group string) (kadm.OffsetResponses, error) {
	committed, err := adm.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return nil, nil
	}
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("fetch the group's offsets: %w", err)
	}
	return committed, nil
}

// groupLag reads the consumer group's committed offsets and returns how a
// partition's lag is counted from them (partitionLag).
func (c *Client) groupLag(ctx context.Context, adm *kadm.Client) (func(end kadm.ListedOffset, starts kadm.ListedOffsets) int64, error) {
	committed, err := groupOffsets(ctx, adm, c.o.Group)
	if err != nil {
		return nil, err
	}
	return func(end kadm.ListedOffset, starts kadm.ListedOffsets) int64 {
		return partitionLag(end, committed, starts, c.settledUpTo(end.Topic, end.Partition))
	}, nil
}

// settledUpTo is the offset before which this member has settled every
// record of the partition, when it owns it and has handed records out;
// else -1. Records settled and not yet committed (a commit goes out every
// commit interval) are no backlog, though the group's lag counts them.
func (c *Client) settledUpTo(topic string, p int32) int64 {
	st := c.partition(topic, p)
	if st == nil {
		return -1
	}
	if next, _, ok := st.wm.peek(nil); ok {
		return next
	}
	return -1
}

// partitionLag is how many records of end's partition are past the group's
// committed offset, or past the log's start when the group has none, or
// past settled, this member's own settled offset, when that is later.
func partitionLag(end kadm.ListedOffset, committed kadm.OffsetResponses, starts kadm.ListedOffsets, settled int64) int64 {
	from := int64(-1)
	if o, ok := committed.Lookup(end.Topic, end.Partition); ok && o.Err == nil {
		from = o.At
	}
	from = max(from, settled)
	if from < 0 {
		if s, ok := starts.Lookup(end.Topic, end.Partition); ok && s.Err == nil {
			from = s.Offset
		}
	}
	if from >= 0 && end.Offset > from {
		return end.Offset - from
	}
	return 0
}
