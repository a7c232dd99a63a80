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
	if n := recordSize(rec); n > c.copyMax() {
		// Only a dead letter can be larger (too-large): the group's
		// client is not sized for it, so it goes through a producer of
		// its own, outside any transaction; its offset is committed
		// after the confirm, like any settled record's.
		return c.produceLarge(ctx, rec, n)
	}
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

// copySlack is room for a copy's key, headers and batch framing beside its
// body.
const copySlack = 64 << 10

// copyMax is the largest copy the group's client produces: a body of
// MaxMessageBytes and its framing.
func (c *Client) copyMax() int {
	m := c.o.MaxMessageBytes
	if m <= 0 {
		m = 1 << 20
	}
	return m + copySlack
}

// sizeOpts sizes a producer for records of up to max bytes. franz-go's
// default batch bound (about 1 MB) would refuse a larger record before any
// broker saw it; a request must also fit a broker write.
func sizeOpts(max int) []kgo.Opt {
	opts := []kgo.Opt{kgo.ProducerBatchMaxBytes(int32(max))}
	if w := max + (1 << 20); w > 100<<20 {
		opts = append(opts, kgo.BrokerMaxWriteBytes(int32(w)))
	}
	return opts
}

// recordSize bounds the bytes rec takes in a batch.
func recordSize(rec *kgo.Record) int {
	n := len(rec.Key) + len(rec.Value) + 64
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return n
}

// produceLarge produces rec, of about n bytes, through a client made for
// it, and closes that client.
func (c *Client) produceLarge(ctx context.Context, rec *kgo.Record, n int) error {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{
		kgo.SeedBrokers(c.o.Brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	}, sizeOpts(n+copySlack)...), c.o.Extra...)...)
	if err != nil {
		return fmt.Errorf("producer for a record of %d bytes: %w", n, err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("produce %d bytes to %s: %w", n, rec.Topic, err)
	}
	return nil
}
