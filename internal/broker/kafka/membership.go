package kafka

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The group's callbacks: what a member does when partitions are assigned to
// it, and when they are revoked or lost.

func (c *Client) assigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	if c.balancer.unbalanced() {
		c.log.Info("kafka group: restarted as its leader and given the previous plan; rebalancing once, in case it no longer fits")
		cl.ForceRebalance()
	}
	ids, shared := c.assignedMarks(ctx, cl, assigned)
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, ps := range assigned {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			st := &partition{tp: tp, lost: make(chan struct{}), out: map[*delivery]struct{}{}, committed: -1, handedBefore: -1, markTarget: -1, ahead: c.markAhead(), topicID: ids[topic]}
			st.markDurable.Store(-1)
			if v, ok := shared[tp]; ok {
				st.handedBefore = v
			}
			if c.o.Marks != nil {
				if v, ok, err := c.journalMark(tp, st.topicID); err != nil {
					c.log.Warn("reading the handed-out mark failed; redeliveries of this partition may go unflagged", "fetch_topic", tp.topic, "partition", tp.partition, "err", err)
				} else if ok {
					st.handedBefore = max(st.handedBefore, v)
				}
			}
			if st.handedBefore >= 0 {
				st.markTarget = st.handedBefore
				st.markDurable.Store(st.handedBefore)
			}
			c.parts[tp] = st
		}
	}
}

// assignedMarks reads what the assigned partitions' marks need from the
// brokers: their topics' ids, and the marks the group's members shared
// (shared.go). Without the brokers' answer, a partition has only the marks
// of this member's journal.
// It is given the group's client: the callback may run before New has set
// c.cl.
func (c *Client) assignedMarks(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) (ids map[string]string, shared map[topicPartition]int64) {
	if c.o.Marks == nil || len(assigned) == 0 {
		return nil, nil
	}
	topics := make([]string, 0, len(assigned))
	for t := range assigned {
		topics = append(topics, t)
	}
	adm := kadm.NewClient(cl)
	ids, err := topicIDs(ctx, adm, topics)
	if err == nil {
		shared, err = c.sharedMarks(ctx, adm, ids)
	}
	if err != nil {
		c.log.Warn("kafka: reading the group's shared handed-out marks failed; records another member may have called before it stopped go unflagged", "err", err)
	}
	return ids, shared
}

// journalMark is tp's mark in this member's journal: the one named by its
// topic's id, or, until the topic's marks were first named so, the one
// named before that.
func (c *Client) journalMark(tp topicPartition, topicID string) (int64, bool, error) {
	v, ok, err := c.o.Marks.Mark(c.markName(tp, topicID))
	if err != nil || topicID == "" {
		return v, ok, err
	}
	named, _, err := c.o.Marks.Mark(c.namedByIDMark(tp.topic))
	if err != nil || named != 0 {
		return v, ok, err
	}
	old, oldOK, err := c.o.Marks.Mark(c.markName(tp, ""))
	if err != nil || !oldOK {
		return v, ok, err
	}
	if !ok || old > v {
		v = old
	}
	return v, true, nil
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

// leave takes a static member out of its group, so that its partitions move
// to the other members at once rather than after the session timeout.
// Closing the client leaves the group only for a dynamic member: franz-go
// keeps a static member in, waiting for it to come back under its id. The
// group management stops first: a member removed while it still heartbeats
// would join again.
//
// Each step has a time of its own: stopping the membership runs the revoke
// callback, which may wait out RevokeTimeout for records still in flight
// (a drain that timed out), and the leave must not starve behind it, or
// the partitions would sit idle for the session timeout after all.
func (c *Client) leave() {
	if c.o.InstanceID == "" {
		return
	}
	stop, cancel := context.WithTimeout(context.Background(), c.o.RevokeTimeout+5*time.Second)
	defer cancel()
	if err := c.cl.LeaveGroupContext(stop); err != nil {
		c.log.Warn("stopping the group membership failed", "err", err)
	}
	ctx, cancelLeave := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelLeave()
	resps, err := kadm.NewClient(c.cl).LeaveGroup(ctx,
		kadm.LeaveGroup(c.group).InstanceIDs(c.o.InstanceID).Reason("sidecar stopped"))
	if err == nil {
		err = resps.Error()
	}
	// Unknown: not in the group any more. franz-go leaves by itself when it
	// closes after revoking partitions in a cooperative rebalance and before
	// joining again, and the session may have expired.
	if err != nil && !errors.Is(err, kerr.UnknownMemberID) {
		c.log.Warn("leaving the group failed; this member's partitions move only after its session timeout",
			"instance_id", c.o.InstanceID, "err", err)
		return
	}
	c.log.Info("left the group", "instance_id", c.o.InstanceID)
}
