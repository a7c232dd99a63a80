package kafka

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// startAtEnd moves the source topic's partitions that have no committed
// offset (the client's reset offset, AtStart, stands in for none) to their
// end, and commits that end before any record is fetched.
func (c *Client) startAtEnd(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	var fresh []int32
	for p, o := range offsets[c.o.Topic] {
		if o.EpochOffset().Offset == kgo.NewOffset().AtStart().EpochOffset().Offset {
			fresh = append(fresh, p)
		}
	}
	if len(fresh) == 0 {
		return offsets, nil
	}
	if h := c.o.hooks; h != nil && h.startAtEnd != nil {
		h.startAtEnd()
	}
	// The group may have joined before NewClient returned the client.
	select {
	case <-c.clSet:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	ends, err := kadm.NewClient(c.cl).ListEndOffsets(ctx, c.o.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("start_from latest: the end of %s: %w", c.o.Topic, err)
	}
	commit := map[string]map[int32]kgo.EpochOffset{c.o.Topic: {}}
	for _, p := range fresh {
		end, ok := ends.Lookup(c.o.Topic, p)
		if !ok {
			return nil, fmt.Errorf("start_from latest: no end offset for %s/%d", c.o.Topic, p)
		}
		offsets[c.o.Topic][p] = kgo.NewOffset().At(end.Offset)
		commit[c.o.Topic][p] = kgo.EpochOffset{Epoch: -1, Offset: end.Offset}
	}
	var cerr error
	c.cl.CommitOffsetsSync(ctx, commit, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil && cerr == nil {
					cerr = e
				}
			}
		}
	})
	if cerr != nil {
		return nil, fmt.Errorf("start_from latest: committing the end of %s: %w", c.o.Topic, cerr)
	}
	c.log.Info("kafka: a new group starts at the end of the topic (start_from: latest)", "topic", c.o.Topic, "partitions", fresh)
	return offsets, nil
}
