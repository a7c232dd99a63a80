package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// With Options.TransactionalID set, the client is a franz-go
// GroupTransactSession and every offset commit goes through a transaction:
// a copy and the offsets of the records it settles commit together or not at
// all, and a member fenced by a rebalance cannot commit either (KIP-447).
//
// One goroutine, the committer, runs the transactions. Transfers queue their
// copies; each round takes everything queued, produces it, and commits the
// offsets the watermarks would reach if those copies' records were settled,
// in the same transaction. A round with no copies commits the offsets that
// acks alone moved (every commitInterval). Transfer returns only once its
// copy's transaction has committed; an aborted round (a rebalance) is run
// again for the records whose partitions are still assigned.

// commitInterval is how often settled offsets are committed when no copy is
// waiting: what a crashed member's successor may redo.
const commitInterval = 250 * time.Millisecond

// ErrRevoked is returned by a transactional Transfer whose record's partition
// was revoked before the copy committed; the copy was aborted, and the
// partition's next owner consumes the record again.
var ErrRevoked = errors.New("kafka: partition revoked before the copy committed")

// txnItem is one copy waiting for its transaction.
type txnItem struct {
	copy *kgo.Record // the copy to produce
	src  *kgo.Record // the record it settles
	st   *partition
	err  error      // the produce's error, set during a round
	done chan error // buffered
}

type committer struct {
	c    *Client
	s    *kgo.GroupTransactSession
	in   chan *txnItem
	stop chan struct{} // closed by Close: commit once more and return
	done chan struct{}
}

func newCommitter(c *Client, s *kgo.GroupTransactSession) *committer {
	return &committer{c: c, s: s, in: make(chan *txnItem), stop: make(chan struct{}), done: make(chan struct{})}
}

// transfer queues a copy and waits until it has committed along with the
// offset of the record it settles.
func (m *committer) transfer(ctx context.Context, copy *kgo.Record, src *kgo.Record) error {
	st := m.c.partition(src.Topic, src.Partition)
	if st == nil {
		return ErrRevoked
	}
	it := &txnItem{copy: copy, src: src, st: st, done: make(chan error, 1)}
	select {
	case m.in <- it:
	case <-ctx.Done():
		return ctx.Err()
	case <-m.done:
		return errors.New("kafka: client closed")
	}
	select {
	case err := <-it.done:
		return err
	case <-ctx.Done():
		// The round may still commit it: unknown, as after a lost ack.
		return ctx.Err()
	}
}

func (m *committer) run() {
	defer close(m.done)
	if !m.initProducer() {
		return
	}
	tick := time.NewTicker(commitInterval)
	defer tick.Stop()
	var queued []*txnItem
	for {
		if len(queued) == 0 {
			select {
			case it := <-m.in:
				queued = append(queued, it)
			case <-tick.C:
			case <-m.stop:
				m.final()
				return
			}
		}
		// Take whatever else is waiting: one transaction for all of it.
	more:
		for {
			select {
			case it := <-m.in:
				queued = append(queued, it)
			default:
				break more
			}
		}
		queued = m.round(queued)
		if len(queued) > 0 {
			// Aborted by a rebalance: let the group settle first.
			select {
			case <-time.After(100 * time.Millisecond):
			case <-m.stop:
				for _, it := range queued {
					it.done <- errors.New("kafka: closed before the copy committed")
				}
				m.final()
				return
			}
		}
	}
}

// initProducer registers the transactional id at once, which aborts a
// transaction that a crash of the previous holder of the id left open. Until
// then the group's offsets of the partitions that transaction wrote are
// unstable, and this member could not start consuming them; it reports
// false when the committer was stopped first.
func (m *committer) initProducer() bool {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _, err := m.s.Client().ProducerID(ctx)
		cancel()
		if err == nil {
			return true
		}
		m.c.log.Warn("kafka transactional producer not ready", "err", err)
		select {
		case <-time.After(time.Second):
		case <-m.stop:
			return false
		}
	}
}

// final commits what acks moved before the client closes, trying again for
// a while when a round fails (a coordinator still loading): a commit lost
// here means the next owner handles those records again.
func (m *committer) final() {
	for range 40 {
		m.round(nil)
		if !m.c.offsetsMoved() {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	m.c.log.Warn("kafka: the last offsets could not be committed; the next owner handles those records again")
}

// round runs one transaction for items and the offsets acks moved, and
// returns the items to try again.
func (m *committer) round(items []*txnItem) (again []*txnItem) {
	c := m.c
	live := items[:0:0]
	for _, it := range items {
		if it.st.isLost() {
			it.done <- ErrRevoked
			continue
		}
		live = append(live, it)
	}
	if len(live) == 0 && !c.offsetsMoved() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.s.Begin(); err != nil {
		m.fail(live, fmt.Errorf("begin transaction: %w", err))
		return nil
	}
	var wg sync.WaitGroup
	for _, it := range live {
		wg.Add(1)
		r := *it.copy // a fresh record each round: producing fills it in
		m.s.Produce(ctx, &r, func(_ *kgo.Record, err error) {
			it.err = err
			wg.Done()
		})
	}
	wg.Wait()
	produced := true
	for _, it := range live {
		if it.err != nil {
			produced = false
		}
	}
	// The offsets go in as the watermarks would stand with these records
	// settled; only the offsets actually sent count as committed.
	settles := map[topicPartition]map[int64]bool{}
	for _, it := range live {
		tp := it.st.tp
		if settles[tp] == nil {
			settles[tp] = map[int64]bool{}
		}
		settles[tp][it.src.Offset] = true
	}
	var sent map[topicPartition]int64
	ctx = kgo.PreTxnCommitFnContext(ctx, func(req *kmsg.TxnOffsetCommitRequest) error {
		sent = c.txnOffsets(req, settles)
		return nil
	})
	committed, err := m.s.End(ctx, kgo.TransactionEndTry(produced))
	switch {
	case err != nil:
		c.log.Error("kafka transaction failed", "err", err)
		m.fail(live, fmt.Errorf("end transaction: %w", err))
		return nil
	case committed:
		for _, it := range live {
			it.st.wm.settle(it.src.Offset)
		}
		c.committed(sent)
		for _, it := range live {
			it.done <- nil
		}
		return nil
	case !produced:
		// Only the copies that failed fail; the others go in the next
		// round.
		c.realign()
		for _, it := range live {
			if it.err != nil {
				it.done <- fmt.Errorf("produce to %s: %w", it.copy.Topic, it.err)
			} else {
				again = append(again, it)
			}
		}
		return again
	default:
		c.log.Info("kafka transaction aborted by a rebalance; trying its copies again", "copies", len(live))
		c.realign()
		return live
	}
}

func (m *committer) fail(items []*txnItem, err error) {
	for _, it := range items {
		it.done <- err
	}
}

// close commits the settled offsets once more and stops the committer.
func (m *committer) close() {
	close(m.stop)
	<-m.done
}

// txnOffsets rewrites req, which franz-go built from the positions polled,
// to commit each partition's watermark (with settles counted as settled),
// and returns what it will commit. A partition with nothing new to commit is
// left out: the polled position may be ahead of records still in flight.
func (c *Client) txnOffsets(req *kmsg.TxnOffsetCommitRequest, settles map[topicPartition]map[int64]bool) map[topicPartition]int64 {
	sent := map[topicPartition]int64{}
	topics := req.Topics[:0]
	for _, t := range req.Topics {
		parts := t.Partitions[:0]
		for _, p := range t.Partitions {
			tp := topicPartition{t.Topic, p.Partition}
			st, last := c.partitionState(tp)
			if st == nil {
				continue
			}
			next, epoch, ok := st.wm.peek(settles[tp])
			if !ok || next <= last {
				continue
			}
			p.Offset, p.LeaderEpoch = next, epoch
			parts = append(parts, p)
			sent[tp] = next
		}
		if len(parts) > 0 {
			t.Partitions = parts
			topics = append(topics, t)
		}
	}
	req.Topics = topics
	return sent
}

// realign undoes the rewind an aborted transaction makes: the session sets
// consumption back to the last commit, which would fetch again what was
// handed out already and leave the polled positions, which bound what the
// next commit may carry, behind the watermarks. Each partition goes back to
// the next record not yet handed out.
func (c *Client) realign() {
	set := map[string]map[int32]kgo.EpochOffset{}
	c.mu.Lock()
	for tp, st := range c.parts {
		if from := st.from.Load(); from > 0 && !st.gone {
			if set[tp.topic] == nil {
				set[tp.topic] = map[int32]kgo.EpochOffset{}
			}
			set[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: -1, Offset: from}
		}
	}
	c.mu.Unlock()
	c.cl.SetOffsets(set)
}

// offsetsMoved reports whether some partition's watermark is past its last
// commit.
func (c *Client) offsetsMoved() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.parts {
		if next, _, ok := st.wm.peek(nil); ok && next > st.committed {
			return true
		}
	}
	return false
}

// committed records the offsets a transaction committed.
func (c *Client) committed(sent map[topicPartition]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for tp, off := range sent {
		if st := c.parts[tp]; st != nil && off > st.committed {
			st.committed = off
		}
	}
}

// partitionState returns tp's state, even while it is being revoked, and its
// last committed offset.
func (c *Client) partitionState(tp topicPartition) (*partition, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.parts[tp]
	if st == nil {
		return nil, 0
	}
	return st, st.committed
}
