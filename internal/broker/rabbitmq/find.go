package rabbitmq

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
)

// findTimeout bounds one read-back of the dead-letter stream (not the wait for
// a slot to read); findSlack is how long before the recorded publish the read
// starts, for the clocks of the sidecar and the broker (which stamps each
// chunk) to disagree.
const (
	findTimeout = 30 * time.Second
	findSlack   = time.Minute
)

// maxFinds bounds the read-backs that run at once: after a crash every
// dead-letter copy that was in flight is looked for.
const maxFinds = 4

// FindCopy reports whether a dead-letter copy with trail's event id, replay id
// and hop is in the dead-letter stream, published since about since. It is
// asked after a crash between publishing a copy and recording its confirm, so
// that a redelivery does not put a second copy in the DLQ.
//
// The stream is read back from a little before since to its end, on a
// channel of its own, as on Kafka; reading removes nothing and is seen by no
// other consumer. How the end is found is ReadStream's: a read that ends
// early, or fails, says not found, and the caller publishes again — a
// duplicate, never a loss.
//
// Retry copies are never looked for: the retry consumer settles a second copy
// of a hop it has already settled, without calling the app.
func (c *Client) FindCopy(ctx context.Context, dest broker.Destination, trail broker.Headers, since time.Time) (bool, error) {
	if !dest.DeadLetter {
		return false, nil
	}
	want, err := broker.CopyIdentity(trail)
	if err != nil {
		return false, err
	}
	// The bound is on the read, not on the wait for a slot: after a crash
	// many look-ups queue up, and one that gave up waiting would publish a
	// second copy.
	select {
	case c.finding <- struct{}{}:
		defer func() { <-c.finding }()
	case <-ctx.Done():
		return false, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, findTimeout)
	defer cancel()
	s, err := c.await(ctx)
	if err != nil {
		return false, err
	}
	var from any = "first"
	if !since.IsZero() {
		from = since.Add(-findSlack)
	}
	queue := DeadLetterQueue(c.opts.Queue)
	found := false
	err = ReadStream(ctx, s.conn, queue, from, func(d *amqp.Delivery) bool {
		var got [3]string
		for i, k := range [3]string{broker.HeaderEventID, broker.HeaderReplayID, broker.HeaderHops} {
			got[i], _ = headerString(d.Headers[k])
		}
		found = got == want
		return !found
	})
	if err != nil {
		return false, fmt.Errorf("read back %s: %w", queue, err)
	}
	return found, nil
}
