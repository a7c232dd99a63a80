package rabbitmq

import (
	"context"
	"fmt"
	"time"
)

// TierDepth is the copies waiting in one delay tier's queue.
type TierDepth struct {
	Tier  time.Duration
	Queue string
	// Ready is the queue's ready count as a passive declare reports it.
	Ready int
}

// RetryDepths reads how many copies wait in each delay tier, in tier order,
// with one passive declare per tier queue on a channel of its own (a failed
// declare closes its channel, never the connection). It returns
// ErrNotConnected without a live connection. It is safe for concurrent use.
func (c *Client) RetryDepths(ctx context.Context) ([]TierDepth, error) {
	s := c.current()
	if s == nil {
		return nil, ErrNotConnected
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	// amqp091-go's declare takes no context: closing the channel is what
	// ends a declare the broker does not answer.
	stop := context.AfterFunc(ctx, func() { _ = ch.Close() })
	defer stop()
	out := make([]TierDepth, 0, len(c.opts.Tiers))
	for _, tier := range c.opts.Tiers {
		q := TierQueue(c.opts.Queue, tier)
		st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			return out, fmt.Errorf("queue %q: %w", q, explain(err))
		}
		out = append(out, TierDepth{Tier: tier, Queue: q, Ready: st.Messages})
	}
	return out, nil
}

// Backlog reads how many messages are ready in the source queue, with a
// passive declare on a channel of its own. It returns ErrNotConnected
// without a live connection.
func (c *Client) Backlog(ctx context.Context) (int64, error) {
	s := c.current()
	if s == nil {
		return 0, ErrNotConnected
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	stop := context.AfterFunc(ctx, func() { _ = ch.Close() })
	defer stop()
	st, err := ch.QueueDeclarePassive(c.opts.Queue, true, false, false, false, nil)
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, fmt.Errorf("queue %q: %w", c.opts.Queue, explain(err))
	}
	return int64(st.Messages), nil
}
