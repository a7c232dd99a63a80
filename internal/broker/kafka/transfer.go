package kafka

import (
	"context"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
)

// Transfer produces a copy of msg to the retry topic of dest's tier or to the
// dead-letter topic, with the original key, value and headers (minus every
// handoff-* header) plus trail, and returns once the brokers have it with
// acks=all. A transactional client returns once the copy has committed
// together with the offset of msg's record.
func (c *Client) Transfer(ctx context.Context, dest broker.Destination, msg *broker.Message, trail broker.Headers) error {
	topic := DeadLetterTopic(c.o.Topic, c.o.Group)
	if !dest.DeadLetter {
		topic = RetryTopic(c.o.Topic, c.o.Group, dest.Tier)
		if !c.retry[topic] {
			return fmt.Errorf("no retry topic for tier %s", broker.TierName(dest.Tier))
		}
	}
	rec := &kgo.Record{Topic: topic, Key: msg.Key, Value: msg.Body, Headers: copyHeaders(msg, trail)}
	if c.txn != nil {
		src, ok := msg.Native.(*kgo.Record)
		if !ok {
			return fmt.Errorf("a transactional transfer needs the record it settles")
		}
		return c.txn.transfer(ctx, rec, src)
	}
	if err := c.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("produce to %s: %w", topic, err)
	}
	return nil
}

// copyHeaders keeps the original headers in their order (Kafka allows
// repeats) without handoff-*, then adds the trail sorted by name.
func copyHeaders(msg *broker.Message, trail broker.Headers) []kgo.RecordHeader {
	var out []kgo.RecordHeader
	if r, ok := msg.Native.(*kgo.Record); ok {
		for _, h := range r.Headers {
			if !broker.IsOwned(h.Key) {
				out = append(out, h)
			}
		}
	} else {
		keys := make([]string, 0, len(msg.Headers))
		for k := range msg.Headers {
			if !broker.IsOwned(k) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			out = append(out, kgo.RecordHeader{Key: k, Value: []byte(msg.Headers[k])})
		}
	}
	keys := make([]string, 0, len(trail))
	for k := range trail {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, kgo.RecordHeader{Key: k, Value: []byte(trail[k])})
	}
	return out
}
