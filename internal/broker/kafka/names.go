package kafka

import (
	"time"

	"handoff.dev/handoff/internal/broker"
)

// RetryTopic is the delay topic of one tier for topic consumed by group.
func RetryTopic(topic, group string, tier time.Duration) string {
	return topic + "." + group + ".retry." + broker.TierName(tier)
}

// DeadLetterTopic is the dead-letter topic for topic consumed by group.
func DeadLetterTopic(topic, group string) string { return topic + "." + group + ".dlq" }
