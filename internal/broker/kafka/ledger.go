package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
)

// LedgerTopic is the dead-letter ledger of topic consumed by group: the log
// of the dead letters' transitions. It has one partition, so that it has
// one order every reader agrees on.
func LedgerTopic(topic, group string) string { return DeadLetterTopic(topic, group) + ".ledger" }

// TopicLog is one topic of the client's source read from offsets: the
// dead-letter topic, or the ledger, which it also appends to. It reads and
// writes with clients of its own, never the consumer group's (which may be
// transactional), and reads only committed records. It is safe for
// concurrent use; Close closes its producer.
type TopicLog struct {
	o     Options
	topic string
	adm   *kadm.Client
	prod  *kgo.Client // nil on a log only read
}

// DeadLetterLog is the source's dead-letter topic, T.G.dlq, to read.
func (c *Client) DeadLetterLog() *TopicLog {
	return &TopicLog{o: c.o, topic: DeadLetterTopic(c.o.Topic, c.o.Group), adm: kadm.NewClient(c.cl)}
}

// LedgerLog is the source's ledger topic, T.G.dlq.ledger, to read and
// append to; Close it when done.
func (c *Client) LedgerLog() (*TopicLog, error) {
	topic := LedgerTopic(c.o.Topic, c.o.Group)
	prod, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(c.o.Brokers...),
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	}, c.o.Extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka ledger producer: %w", err)
	}
	return &TopicLog{o: c.o, topic: topic, adm: kadm.NewClient(c.cl), prod: prod}, nil
}

// Close closes the producer, if any. It is safe to call twice.
func (l *TopicLog) Close() {
	if l.prod != nil {
		l.prod.Close()
	}
}

// Name is the topic's name.
func (l *TopicLog) Name() string { return l.topic }

// First returns every partition's first offset (its log start): retention
// moves it, and a partition that retention emptied has it at its end.
func (l *TopicLog) First(ctx context.Context) (map[int32]int64, error) {
	var starts kadm.ListedOffsets
	// A topic just created is unknown to the brokers' metadata for a
	// moment, and to the client's until its cached metadata is refreshed
	// (at most every 5s, franz-go's MetadataMinAge); the producer retries
	// that on its own, an admin request not.
	backoff := budget.NewBackoff(50*time.Millisecond, time.Second)
	for waited := time.Duration(0); ; {
		var err error
		starts, err = l.adm.ListStartOffsets(ctx, l.topic)
		if err == nil {
			err = starts.Error()
		}
		if err == nil {
			break
		}
		if !errors.Is(err, kerr.UnknownTopicOrPartition) || waited >= 8*time.Second {
			return nil, fmt.Errorf("list start offsets of %s: %w", l.topic, err)
		}
		wait := backoff.Next()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		waited += wait
	}
	out := map[int32]int64{}
	starts.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out, nil
}

// Read calls each for every committed record from from[p] (a partition's
// first when absent or below it) to the partition's last stable offset as
// it was when Read began, in offset order within a partition. The time is
// the record's timestamp.
func (l *TopicLog) Read(ctx context.Context, from map[int32]int64, each func(partition int32, offset int64, at time.Time, m *broker.Message) error) error {
	starts, err := l.First(ctx)
	if err != nil {
		return err
	}
	// Read committed, up to the last stable offset; control records are
	// kept so that the read reaches that offset even when the last record
	// before it is one.
	ends, err := l.adm.ListCommittedOffsets(ctx, l.topic)
	if err != nil {
		return fmt.Errorf("list stable offsets of %s: %w", l.topic, err)
	}
	offsets := map[int32]kgo.Offset{}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		start := max(from[o.Partition], starts[o.Partition])
		if o.Err == nil && start < o.Offset {
			offsets[o.Partition] = kgo.NewOffset().At(start)
			left[o.Partition] = o.Offset
		}
	})
	if len(offsets) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(l.o.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{l.topic: offsets}),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	}, l.o.Extra...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for len(left) > 0 {
		f := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("read %s: %w", l.topic, err)
		}
		if errs := f.Errors(); len(errs) > 0 {
			return fmt.Errorf("read %s/%d: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
		}
		var failed error
		f.EachRecord(func(r *kgo.Record) {
			end, ok := left[r.Partition]
			if failed != nil || !ok || r.Offset >= end {
				return
			}
			if r.Offset+1 >= end {
				delete(left, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			m := &broker.Message{
				Body:     r.Value,
				Key:      r.Key,
				Headers:  make(broker.Headers, len(r.Headers)),
				Position: fmt.Sprintf("kafka:%s/%d/%d", r.Topic, r.Partition, r.Offset),
			}
			for _, h := range r.Headers {
				m.Headers[h.Key] = string(h.Value)
			}
			m.ContentType = m.Headers[contentTypeHeader]
			failed = each(r.Partition, r.Offset, r.Timestamp, m)
		})
		if failed != nil {
			return failed
		}
	}
	return nil
}

// Append produces body to the ledger and returns once every in-sync
// replica has it.
func (l *TopicLog) Append(ctx context.Context, body []byte) error {
	if l.prod == nil {
		return fmt.Errorf("append to %s: opened to read only", l.topic)
	}
	if err := l.prod.ProduceSync(ctx, &kgo.Record{Value: body}).FirstErr(); err != nil {
		return fmt.Errorf("append to %s: %w", l.topic, err)
	}
	return nil
}
