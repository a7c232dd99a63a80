package kafka

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Kafka has no redelivered flag: the handed-out marks, kept in the journal,
// say which records may have reached the app before a crash.

// Marks stores named high-water marks durably (the journal).
type Marks interface {
	Mark(name string) (int64, bool, error)
	SetMarks(ctx context.Context, marks map[string]int64) error
}

// markName is the name of tp's handed-out mark: per group, since each group
// consumes the topic on its own, and per topic id (see shared.go), when it
// is known. Without one it is the name the marks had before they were
// named by topic id.
func (c *Client) markName(tp topicPartition, topicID string) string {
	name := "kafka/" + c.o.Group + "/" + tp.topic + "/" + strconv.Itoa(int(tp.partition))
	if topicID != "" {
		name += "/" + topicID
	}
	return name
}

// namedByIDMark is the name of the mark that says topic's marks are named
// by its id: from then on a mark of the old name is not read, as it may be
// a deleted topic's of the same name.
func (c *Client) namedByIDMark(topic string) string {
	return "kafka/" + c.o.Group + "/" + topic + "/named-by-id"
}

// markAhead is how far past the last record handed out a partition's mark
// is set at least: a mark is written once per so many records, not once a
// poll, and the next is written while half of them are still ahead, so a
// call rarely waits for one. After a crash, up to this many records past
// the last one handed out come flagged redelivered although they never
// reached the app.
func (c *Client) markAhead() int64 { return int64(max(c.o.MaxInFlight, 64)) }

// markSpan is how much of a partition's recent rate a mark covers beyond
// markAhead: a second of records, so that a journal commit held up by the
// disk for a few hundred milliseconds does not hold the next calls back
// waiting for the mark.
const markSpan = time.Second

// nextAhead is how far past top, handed out at now, st's next mark goes:
// markAhead, or the records st handed out in the last markSpan at the rate
// since its previous mark, up to the records the client may hold.
func (c *Client) nextAhead(st *partition, top int64, now time.Time) int64 {
	ahead := c.markAhead()
	if el := now.Sub(st.markAt); !st.markAt.IsZero() && el > 0 {
		recent := float64(top-st.markTop) * markSpan.Seconds() / el.Seconds()
		ahead = max(ahead, min(int64(recent), int64(cap(c.held)+cap(c.sem))))
	}
	st.markAt, st.markTop = now, top
	return ahead
}

// markHandedOut starts writing, in one journal commit for the whole poll,
// the marks of the partitions whose records about to be handed out reach
// past (or near) what their marks cover. The records are handed out at
// once: a delivery above its partition's durable mark carries the pending
// write, which the engine waits for before it calls the app, so the commit
// overlaps the hand-off's own work, and most calls wait for none.
func (c *Client) markHandedOut(ctx context.Context, fetches kgo.Fetches) {
	now := c.now()
	var renewed []*partition
	var marks map[string]int64 // made only on a poll that renews a mark
	fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
		st := c.partition(ftp.Topic, ftp.Partition)
		if st == nil {
			return
		}
		top := int64(-1)
		for _, r := range ftp.Records {
			if r.Offset < st.from.Load() {
				continue
			}
			if c.retry[r.Topic] {
				if due, ok := nextDue(r); ok && c.now().Before(due) {
					break // paused here: the rest is fetched again later
				}
			}
			top = r.Offset
		}
		if top >= 0 && top > st.markTarget-st.ahead/2 {
			st.ahead = c.nextAhead(st, top, now)
			st.markTarget = top + st.ahead
			if marks == nil {
				marks = map[string]int64{}
			}
			marks[c.markName(st.tp, st.topicID)] = st.markTarget
			if st.topicID != "" {
				marks[c.namedByIDMark(st.tp.topic)] = 1
			}
			renewed = append(renewed, st)
		}
	})
	if len(marks) == 0 {
		return
	}
	done := make(chan struct{})
	targets := make([]int64, len(renewed))
	for i, st := range renewed {
		st.markPending = done
		targets[i] = st.markTarget
	}
	shared := make(map[*partition]int64, len(renewed))
	for i, st := range renewed {
		if st.topicID != "" {
			shared[st] = targets[i]
		}
	}
	c.timers.Add(1)
	go func() {
		defer c.timers.Done()
		defer close(done)
		// The journal's marks and the group's shared ones are written at
		// once; a call above either waits for both.
		sharedErr := make(chan error, 1)
		go func() {
			if len(shared) == 0 {
				sharedErr <- nil
				return
			}
			sharedErr <- c.shareMarks(ctx, shared)
		}()
		defer func() { c.shared(ctx, <-sharedErr) }()
		if err := c.o.Marks.SetMarks(ctx, marks); err != nil {
			if ctx.Err() == nil {
				c.log.Warn("writing the handed-out marks failed; after a crash now, repeated calls may not say redelivered", "err", err)
			}
			return
		}
		for i, st := range renewed {
			for {
				cur := st.markDurable.Load()
				if cur >= targets[i] || st.markDurable.CompareAndSwap(cur, targets[i]) {
					break
				}
			}
		}
	}()
}
