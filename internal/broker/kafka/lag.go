package kafka

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
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
	committed, err := adm.FetchOffsets(ctx, c.o.Group)
	if err != nil {
		return nil, fmt.Errorf("fetch the group's offsets: %w", err)
	}
	if err := committed.Error(); err != nil {
		return nil, fmt.Errorf("fetch the group's offsets: %w", err)
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
		out[i].Lag += partitionLag(end, committed, starts)
	})
	if failed != nil {
		return nil, failed
	}
	return out, nil
}

// Backlog reads the group's lag on the source topic (the records past its
// committed offsets, over every partition) and the sum of the topic's end
// offsets: what was ever produced to it, whose growth is the arrival rate.
func (c *Client) Backlog(ctx context.Context) (lag, produced int64, err error) {
	adm := kadm.NewClient(c.cl)
	committed, err := adm.FetchOffsets(ctx, c.o.Group)
	if err != nil {
		return 0, 0, fmt.Errorf("fetch the group's offsets: %w", err)
	}
	if err := committed.Error(); err != nil {
		return 0, 0, fmt.Errorf("fetch the group's offsets: %w", err)
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
		lag += partitionLag(end, committed, starts)
	})
	return lag, produced, failed
}

// partitionLag is how many records of end's partition are past the group's
// committed offset, or past the log's start when the group has none.
func partitionLag(end kadm.ListedOffset, committed kadm.OffsetResponses, starts kadm.ListedOffsets) int64 {
	from := int64(-1)
	if o, ok := committed.Lookup(end.Topic, end.Partition); ok && o.Err == nil {
		from = o.At
	}
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
