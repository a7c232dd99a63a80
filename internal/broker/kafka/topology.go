package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Declare checks that the source topic exists and creates the retry and
// dead-letter topics that are missing, with the source's partition count and
// the brokers' default replication. Without Options.Declare it only checks
// that they exist.
func (c *Client) Declare(ctx context.Context) error {
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
	want := []string{DeadLetterTopic(c.o.Topic, c.o.Group)}
	for t := range c.retry {
		want = append(want, t)
	}
	have, err := adm.ListTopics(ctx, want...)
	if err != nil {
		return fmt.Errorf("describe derived topics: %w", err)
	}
	var missing []string
	for _, t := range want {
		if d, ok := have[t]; !ok || d.Err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if !c.o.Declare {
		return fmt.Errorf("topics missing and declare is off: %v", missing)
	}
	resp, err := adm.CreateTopics(ctx, partitions, -1, nil, missing...)
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for _, r := range resp {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", r.Topic, r.Err)
		}
	}
	c.log.Info("kafka topics created", "topics", missing)
	return nil
}
