package rabbitmq

import (
	"context"
	"fmt"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// browseLimit bounds how many dead letters one read-back looks at; browseTimeout
// bounds how long it takes.
const (
	browseLimit   = 20000
	browseTimeout = 30 * time.Second
)

// FindCopy reports whether a dead-letter copy with trail's event id, replay id
// and hop is in the DLQ. It is asked after a crash between publishing a copy
// and recording its confirm, so that a redelivery does not put a second copy
// in the DLQ.
//
// A queue has no read-back of its own: FindCopy browses the DLQ with
// basic.get on a channel of its own, holding every message it looked at
// unacked, and closes the channel, which hands them all back in their order.
// Browsing marks them redelivered and, on a quorum queue, counts a delivery
// (x-delivery-count); a DLQ should carry no delivery-limit. A copy held
// unacked by a consumer of the DLQ cannot be seen, and neither can one beyond
// browseLimit: then FindCopy says not found, or errs, and the caller
// publishes again — a duplicate, never a loss. One browse runs at a time per
// client, or two would hide messages from each other.
//
// Retry copies are never looked for: the retry consumer settles a second copy
// of a hop it has already settled, without calling the app.
func (c *Client) FindCopy(ctx context.Context, dest broker.Destination, trail broker.Headers, _ time.Time) (bool, error) {
	if !dest.DeadLetter {
		return false, nil
	}
	want, err := broker.CopyIdentity(trail)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, browseTimeout)
	defer cancel()
	s, err := c.await(ctx)
	if err != nil {
		return false, err
	}
	select {
	case c.browsing <- struct{}{}:
		defer func() { <-c.browsing }()
	case <-ctx.Done():
		return false, ctx.Err()
	}
	queue := DeadLetterQueue(c.opts.Queue)
	ch, err := s.conn.Channel()
	if err != nil {
		return false, fmt.Errorf("browse %s: %w", queue, err)
	}
	// Closing the channel requeues everything the browse took.
	defer func() { _ = ch.Close() }()
	for n := 0; n < browseLimit; n++ {
		if err := ctx.Err(); err != nil {
			return false, fmt.Errorf("browse %s: %w after %d messages", queue, err, n)
		}
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return false, fmt.Errorf("browse %s: %w", queue, err)
		}
		if !ok {
			return false, nil
		}
		var got [3]string
		for i, k := range [3]string{broker.HeaderEventID, broker.HeaderReplayID, broker.HeaderHops} {
			got[i], _ = headerString(d.Headers[k])
		}
		if got == want {
			return true, nil
		}
	}
	return false, fmt.Errorf("browse %s: more than %d messages; the copy may be beyond them", queue, browseLimit)
}
