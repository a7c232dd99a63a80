package rabbitmq

import (
	"context"
	"fmt"

	"handoff.dev/handoff/internal/broker"
)

// Republish publishes a copy of msg to the source queue itself — a replayed
// dead letter — persistent, with msg's body, content type, message id and
// type, its headers minus every handoff-* header, and trail; it returns once
// the broker confirmed it. An unroutable copy (the queue is gone) is an
// error. Unlike Transfer, which the engine retries, it waits for a
// connection until ctx is done, as the dead-letter logs' calls do.
func (c *Client) Republish(ctx context.Context, msg *broker.Message, trail broker.Headers) error {
	s, err := c.await(ctx)
	if err != nil {
		return fmt.Errorf("republish to %s: waiting for a connection: %w", c.opts.Queue, err)
	}
	p := copyOf(msg, trail)
	// A message read from a stream or a quorum queue carries the broker's
	// own bookkeeping of where it was; the source queue keeps its own.
	delete(p.Headers, streamOffsetArg)
	delete(p.Headers, deliveryCountHeader)
	return s.pub.publish(ctx, c.opts.Queue, p)
}
