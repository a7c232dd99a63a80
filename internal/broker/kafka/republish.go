package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
)

// errClosed is returned by Republish once Close has begun.
var errClosed = errors.New("kafka: client closed")

// Republish produces a copy of msg to the source topic itself — a replayed
// dead letter — with msg's key and body, its headers minus every handoff-*
// header, its content type, and trail; it returns once every in-sync
// replica has the record (acks=all).
//
// A transactional client's own producer can produce only inside a
// transaction, and its transactions belong to the committer: they carry
// offset commits and are aborted by a rebalance. A replayed copy settles no
// record, so it goes through a plain producer of its own, made on first use
// and closed by Close.
func (c *Client) Republish(ctx context.Context, msg *broker.Message, trail broker.Headers) error {
	cl, err := c.plainProducer()
	if err != nil {
		return fmt.Errorf("republish to %s: %w", c.o.Topic, err)
	}
	rec := &kgo.Record{Topic: c.o.Topic, Key: msg.Key, Value: msg.Body,
		Headers: withContentType(copyHeaders(msg, trail), msg.ContentType)}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("republish to %s: %w", c.o.Topic, err)
	}
	return nil
}

// plainProducer is a client that produces outside transactions: the
// group's own client, unless that one is transactional.
func (c *Client) plainProducer() (*kgo.Client, error) {
	if c.txn == nil {
		return c.cl, nil
	}
	c.plainMu.Lock()
	defer c.plainMu.Unlock()
	select {
	case <-c.closed:
		// Made now, it would outlive Close.
		return nil, errClosed
	default:
	}
	if c.plain == nil {
		cl, err := kgo.NewClient(append([]kgo.Opt{
			kgo.SeedBrokers(c.o.Brokers...),
			kgo.RequiredAcks(kgo.AllISRAcks()),
		}, c.o.Extra...)...)
		if err != nil {
			return nil, fmt.Errorf("plain producer: %w", err)
		}
		c.plain = cl
	}
	return c.plain, nil
}

// closePlainProducer closes the plain producer, if one was made; none is
// made after it.
func (c *Client) closePlainProducer() {
	c.plainMu.Lock()
	defer c.plainMu.Unlock()
	if c.plain != nil {
		c.plain.Close()
		c.plain = nil
	}
}

// withContentType makes the content-type header say ct. On Kafka the
// content type is that header; a replay may carry a repaired body of
// another type than the original's, so msg.ContentType wins over the
// header it came with. An empty ct leaves the headers as they are.
func withContentType(hs []kgo.RecordHeader, ct string) []kgo.RecordHeader {
	if ct == "" {
		return hs
	}
	out := hs[:0]
	set := false
	for _, h := range hs {
		if h.Key != contentTypeHeader {
			out = append(out, h)
			continue
		}
		if !set {
			out = append(out, kgo.RecordHeader{Key: contentTypeHeader, Value: []byte(ct)})
			set = true
		}
	}
	if !set {
		out = append(out, kgo.RecordHeader{Key: contentTypeHeader, Value: []byte(ct)})
	}
	return out
}
