package kafka

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The group's callbacks: what a member does when partitions are assigned to
// it, and when they are revoked or lost.

func (c *Client) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	if c.balancer.unbalanced() {
		c.log.Info("kafka group: restarted as its leader and given the previous plan; rebalancing once, in case it no longer fits")
		cl.ForceRebalance()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, ps := range assigned {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			st := &partition{tp: tp, lost: make(chan struct{}), out: map[*delivery]struct{}{}, committed: -1, handedBefore: -1, markTarget: -1, ahead: c.markAhead()}
			st.markDurable.Store(-1)
			if c.o.Marks != nil {
				if v, ok, err := c.o.Marks.Mark(c.markName(tp)); err != nil {
					c.log.Warn("reading the handed-out mark failed; redeliveries of this partition may go unflagged", "fetch_topic", tp.topic, "partition", tp.partition, "err", err)
				} else if ok {
					st.handedBefore, st.markTarget = v, v
					st.markDurable.Store(v)
				}
			}
			c.parts[tp] = st
		}
	}
}

// revoked stops handing out the partitions' records, lets those in flight
// finish for up to RevokeTimeout, abandons the rest (their Lost closes: the
// next owner consumes them again), and commits the watermark.
//
// A transactional client abandons them at once and commits nothing: the
// transaction session calls this holding the lock that ending a transaction
// needs, so no copy can commit until it returns, and the open transaction is
// aborted anyway. The next owner starts from the last committed transaction.
func (c *Client) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	var ps []*partition
	c.mu.Lock()
	for topic, parts := range revoked {
		for _, p := range parts {
			if st := c.parts[topicPartition{topic, p}]; st != nil {
				st.gone = true
				ps = append(ps, st)
			}
		}
	}
	c.mu.Unlock()
	deadline := time.Now().Add(c.o.RevokeTimeout)
	if c.txn != nil {
		deadline = time.Now()
	}
	for _, p := range ps {
		for p.outstanding() > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	c.mu.Lock()
	for _, p := range ps {
		close(p.lost)
		delete(c.parts, p.tp)
	}
	c.mu.Unlock()
	// Deliveries abandoned with their partition free their slots here: their
	// walks stop on Lost without settling.
	for _, p := range ps {
		p.mu.Lock()
		abandoned := make([]*delivery, 0, len(p.out))
		for d := range p.out {
			abandoned = append(abandoned, d)
		}
		p.mu.Unlock()
		for _, d := range abandoned {
			p.finish(d, c)
		}
	}
	if c.txn != nil {
		return
	}
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		c.log.Warn("commit on revoke failed; the next owner may handle some records again", "err", err)
	}
}
