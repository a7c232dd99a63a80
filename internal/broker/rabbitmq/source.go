package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
)

// Source consumes one queue of a Client with manual acks.
type Source struct {
	c     *Client
	queue string
	copy  bool // the queue holds the sidecar's own copies
}

// Source returns the consumer of the source queue.
func (c *Client) Source() *Source { return &Source{c: c, queue: c.opts.Queue} }

// RetrySource returns the consumer of the retry work queue.
func (c *Client) RetrySource() *Source {
	return &Source{c: c, queue: RetryQueue(c.opts.Queue), copy: true}
}

// Queue is the name of the consumed queue.
func (s *Source) Queue() string { return s.queue }

// Consume calls deliver for each delivery, from one goroutine, until ctx is
// done. deliver may block: with prefetch, that is how intake is held back.
// Across reconnects it resumes on the new connection. When ctx is done it
// cancels the consumer but leaves the channel open, so deliveries in flight
// can still be acked; the channel closes with the Client.
func (s *Source) Consume(ctx context.Context, deliver func(broker.Delivery)) error {
	for {
		sess, err := s.c.await(ctx)
		if err != nil {
			return nil
		}
		if err := s.consume(ctx, sess, deliver); err != nil {
			s.c.log.Warn("consumer stopped; waiting for the connection to be rebuilt", "consumer_queue", s.queue, "err", err)
			sess.fail(err)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

func (s *Source) consume(ctx context.Context, sess *session, deliver func(broker.Delivery)) error {
	ch, err := sess.conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(s.c.opts.Prefetch, 0, false); err != nil {
		return fmt.Errorf("qos: %w", err)
	}
	tag := consumerTag(s.queue)
	deliveries, err := ch.Consume(s.queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", s.queue, err)
	}
	// lost is closed when the channel goes: its deliveries can no longer be
	// settled, and the broker has requeued them.
	lost := make(chan struct{})
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if !s.c.track() {
		_ = ch.Close() // the client is stopping; nothing was delivered yet
		return nil
	}
	acks := newAcker(ch, s.c.opts.Prefetch)
	sess.addAcker(acks)
	go func() {
		defer s.c.wg.Done()
		err := <-closed
		close(lost)
		acks.close()
		if err != nil {
			sess.fail(err)
		}
	}()
	origin := "rabbitmq:" + s.queue
	for {
		select {
		case <-ctx.Done():
			acks.calls.Lock()
			err := ch.Cancel(tag, false)
			acks.calls.Unlock()
			if err != nil {
				s.c.log.Debug("cancel consumer", "err", err)
			}
			return nil
		case <-sess.done:
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("consumer of %s cancelled by the broker", s.queue)
			}
			acks.delivered(d.DeliveryTag)
			dl := newDelivery(d, origin, s.copy, lost, acks)
			if limit := s.c.opts.DeliveryLimit; limit > 0 && dl.msg.DeliveryCount >= limit {
				dl.msg.FinalDelivery = true
			}
			deliver(dl)
		}
	}
}

func consumerTag(queue string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "handoff." + queue + "." + hex.EncodeToString(b[:])
}

// delivery is one AMQP delivery with its handle.
type delivery struct {
	d    amqp.Delivery
	msg  broker.Message
	lost <-chan struct{}
	acks *acker
}

var _ broker.Delivery = (*delivery)(nil)

func newDelivery(d amqp.Delivery, origin string, copy bool, lost <-chan struct{}, acks *acker) *delivery {
	dl := &delivery{d: d, lost: lost, acks: acks}
	dl.msg = broker.Message{
		Body:        d.Body,
		ContentType: d.ContentType,
		MessageID:   d.MessageId,
		Type:        d.Type,
		Headers:     stringHeaders(d.Headers),
		Origin:      origin,
		Copy:        copy,
		Redelivered: d.Redelivered,
		Native:      &dl.d,
	}
	dl.msg.DeliveryCount = deliveryCount(d.Headers)
	return dl
}

// deliveryCount is a quorum queue's count of a message's earlier
// deliveries, 0 when the header is missing (a first delivery, or a queue
// that does not count).
func deliveryCount(h amqp.Table) int {
	switch v := h[deliveryCountHeader].(type) {
	case int64:
		return int(max(v, 0))
	case int32:
		return int(max(v, 0))
	case int:
		return max(v, 0)
	case int16:
		return int(max(v, 0))
	case int8:
		return int(max(v, 0))
	}
	return 0
}

func (d *delivery) Message() *broker.Message { return &d.msg }
func (d *delivery) Ack() error               { return d.acks.ack(d.d.DeliveryTag) }
func (d *delivery) Release() error           { return d.acks.release(d.d.DeliveryTag) }
func (d *delivery) Lost() <-chan struct{}    { return d.lost }
