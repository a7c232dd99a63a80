package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Declare checks that the source topic exists and creates the retry and
// dead-letter topics that are missing, with the source's partition count and
// the brokers' default replication. Without Options.Declare it only checks
// that they exist.
func (c *Client) Declare(ctx context.Context) error {
	if err := c.declareTopics(ctx); err != nil {
		return err
	}
	if c.share != nil {
		return c.share.declare(ctx)
	}
	return nil
}

func (c *Client) declareTopics(ctx context.Context) error {
	adm := kadm.NewClient(c.cl)
	details, err := adm.ListTopics(ctx, c.o.Topic)
	if err != nil {
		return fmt.Errorf("describe topic %s: %w", c.o.Topic, err)
	}
	src, ok := details[c.o.Topic]
	if !ok || errors.Is(src.Err, kerr.UnknownTopicOrPartition) {
		return fmt.Errorf("source topic %s does not exist", c.o.Topic)
	}
	if src.Err != nil {
		return fmt.Errorf("describe topic %s: %w", c.o.Topic, src.Err)
	}
	partitions := int32(len(src.Partitions))
	ledger := LedgerTopic(c.o.Topic, c.o.Group)
	want := []string{DeadLetterTopic(c.o.Topic, c.o.Group), ledger}
	for t := range c.retry {
		want = append(want, t)
	}
	have, err := adm.ListTopics(ctx, want...)
	if err != nil {
		return fmt.Errorf("describe derived topics: %w", err)
	}
	dlq := DeadLetterTopic(c.o.Topic, c.o.Group)
	sizes := c.copySizes(ctx, adm, dlq)
	var missing, present []string
	for _, t := range want {
		d, ok := have[t]
		if !ok || d.Err != nil {
			missing = append(missing, t)
			continue
		}
		if t != ledger {
			present = append(present, t)
		}
		if t == dlq {
			c.checkRetention(ctx, adm, dlq)
		} else if t == ledger && len(d.Partitions) != 1 {
			// Records spread over partitions have no one order, and
			// replicas would decide the same transitions differently.
			return fmt.Errorf("dead-letter ledger topic %s has %d partitions; it needs one: delete it, or create it with one", t, len(d.Partitions))
		}
	}
	c.checkSizes(ctx, adm, present, sizes)
	if len(missing) == 0 {
		return nil
	}
	if !c.o.Declare {
		return fmt.Errorf("topics missing and declare is off: %v", missing)
	}
	var created []string
	for _, t := range missing {
		configs := map[string]*string{}
		// The ledger keeps what the DLQ keeps: a record lives as long as
		// the dead letter it names. It has one partition: one order.
		if (t == dlq || t == ledger) && c.o.DeadLetterRetention > 0 {
			configs["retention.ms"] = kadm.StringPtr(retentionMs(c.o.DeadLetterRetention))
		}
		if n, ok := sizes[t]; ok {
			configs["max.message.bytes"] = kadm.StringPtr(strconv.Itoa(n))
		}
		n := partitions
		if t == ledger {
			n = 1
		}
		resp, err := adm.CreateTopics(ctx, n, -1, configs, t)
		if err != nil {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
		for _, r := range resp {
			switch {
			case errors.Is(r.Err, kerr.TopicAlreadyExists):
			case r.Err != nil:
				return fmt.Errorf("create topic %s: %w", r.Topic, r.Err)
			default:
				created = append(created, r.Topic)
			}
		}
	}
	c.log.Info("kafka topics created", "topics", created, "dead_letter_retention", c.o.DeadLetterRetention)
	return nil
}

// copySizes is the max.message.bytes each derived topic needs: a retry
// topic, a copy of up to MaxMessageBytes; the dead-letter topic, also
// whatever the source topic takes (a too-large record is dead-lettered
// whole). The ledger's records are small, and it is not listed.
func (c *Client) copySizes(ctx context.Context, adm *kadm.Client, dlq string) map[string]int {
	sizes := map[string]int{dlq: c.copyMax()}
	for t := range c.retry {
		sizes[t] = c.copyMax()
	}
	if src, ok := topicConfig(ctx, adm, c.o.Topic, "max.message.bytes"); ok {
		if n, err := strconv.Atoi(src); err == nil && n+copySlack > sizes[dlq] {
			sizes[dlq] = n + copySlack
		}
	}
	return sizes
}

// checkSizes logs each existing derived topic that takes smaller records
// than its copies may be: a copy it refuses is published again and again
// while its record waits. The topic is left as it is (the operator's
// decision), and the log line says what to set.
func (c *Client) checkSizes(ctx context.Context, adm *kadm.Client, topics []string, sizes map[string]int) {
	for _, t := range topics {
		v, ok := topicConfig(ctx, adm, t, "max.message.bytes")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n >= sizes[t] {
			continue
		}
		c.log.Warn("a derived topic takes smaller records than its copies may be; raise its max.message.bytes",
			"topic", t, "max_message_bytes", n, "needed", sizes[t])
	}
}

// topicConfig reads one config value of topic; ok is false when it cannot
// be read.
func topicConfig(ctx context.Context, adm *kadm.Client, topic, key string) (string, bool) {
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return "", false
	}
	rc, err := rcs.On(topic, nil)
	if err != nil || rc.Err != nil {
		return "", false
	}
	for _, cfg := range rc.Configs {
		if cfg.Key == key && cfg.Value != nil {
			return *cfg.Value, true
		}
	}
	return "", false
}

// retentionMs is d as a retention.ms value.
func retentionMs(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// checkRetention logs when an existing dead-letter topic keeps its dead
// letters for another time than configured. The topic is left as it is:
// changing a topic's retention is the operator's decision, and one the
// brokers' own tools make.
func (c *Client) checkRetention(ctx context.Context, adm *kadm.Client, topic string) {
	if c.o.DeadLetterRetention <= 0 {
		return
	}
	v, ok := topicConfig(ctx, adm, topic, "retention.ms")
	if want := retentionMs(c.o.DeadLetterRetention); ok && v != want {
		c.log.Warn("the dead-letter topic's retention differs from deadletter.retention; it is left as it is",
			"topic", topic, "retention_ms", v, "configured_ms", want)
	}
}
