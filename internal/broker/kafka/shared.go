package kafka

import (
	"context"
	"encoding/hex"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// The handed-out marks in the journal flag the repeats of a member that
// restarts on it. A member that takes over a crashed member's partitions
// has another journal: for it, each mark is also committed, as an offset,
// to a group of its own beside the consuming one (MarksGroup), which
// every member can read. Its metadata is the topic's id, so a topic
// deleted and made again under the same name does not inherit the marks
// of the one before; the marks in the journal are named with the id too.
//
// The group has no members: its offsets are written as an admin tool
// writes them, and never read by a consumer.

// MarksGroup is the group that holds the handed-out marks of group's
// members.
func MarksGroup(group string) string { return group + ".handoff-marks" }

// sharedTimeout bounds the reads and writes of the shared marks: a broker
// that does not answer must not hold an assignment, or the calls waiting
// for a mark, for long.
const sharedTimeout = 10 * time.Second

// topicIDs returns the ids of topics, hex-encoded; a topic whose id the
// brokers do not know is left out.
func topicIDs(ctx context.Context, adm *kadm.Client, topics []string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, sharedTimeout)
	defer cancel()
	td, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return nil, err
	}
	ids := map[string]string{}
	for name, d := range td {
		if d.Err == nil && d.ID != (kadm.TopicID{}) {
			ids[name] = hex.EncodeToString(d.ID[:])
		}
	}
	return ids, nil
}

// sharedMarks reads the marks committed to the marks group for topics,
// keeping those written for the topic ids in ids.
func (c *Client) sharedMarks(ctx context.Context, adm *kadm.Client, ids map[string]string) (map[topicPartition]int64, error) {
	topics := make([]string, 0, len(ids))
	for t := range ids {
		topics = append(topics, t)
	}
	if len(topics) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, sharedTimeout)
	defer cancel()
	rs, err := adm.FetchOffsetsForTopics(ctx, MarksGroup(c.o.Group), topics...)
	if err != nil {
		return nil, err
	}
	out := map[topicPartition]int64{}
	rs.Each(func(r kadm.OffsetResponse) {
		if r.Err == nil && r.At >= 0 && r.Metadata == ids[r.Topic] {
			out[topicPartition{r.Topic, r.Partition}] = r.At
		}
	})
	return out, nil
}

// shareMarks commits marks, by partition, to the marks group, each with its
// topic's id.
func (c *Client) shareMarks(ctx context.Context, marks map[*partition]int64) error {
	ctx, cancel := context.WithTimeout(ctx, sharedTimeout)
	defer cancel()
	var os kadm.Offsets
	for st, v := range marks {
		os.Add(kadm.Offset{Topic: st.tp.topic, Partition: st.tp.partition, At: v, LeaderEpoch: -1, Metadata: st.topicID})
	}
	rs, err := kadm.NewClient(c.cl).CommitOffsets(ctx, MarksGroup(c.o.Group), os)
	if err != nil {
		return err
	}
	return rs.Error()
}

// shared logs the first of a run of failed writes of the shared marks, and
// the write that ends it.
func (c *Client) shared(ctx context.Context, err error) {
	switch {
	case err == nil:
		if c.sharedDown.CompareAndSwap(true, false) {
			c.log.Info("kafka: the handed-out marks are shared with the group again", "marks_group", MarksGroup(c.o.Group))
		}
	case ctx.Err() != nil:
	case c.sharedDown.CompareAndSwap(false, true):
		c.log.Warn("kafka: the handed-out marks could not be shared with the group; a member that takes these partitions over after a crash may call repeats unflagged (a restart on this journal still flags them)",
			"marks_group", MarksGroup(c.o.Group), "err", err)
	}
}
