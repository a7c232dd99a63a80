package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// KafkaBrokers is the local Apache Kafka the tests use: HANDOFF_KAFKA_BROKERS,
// else the one scripts/kafka-local starts.
func KafkaBrokers() []string {
	if v := os.Getenv("HANDOFF_KAFKA_BROKERS"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"127.0.0.1:19092"}
}

// KafkaGroup is the consumer group tests use for topic.
func KafkaGroup(topic string) string { return topic + "-g" }

// DropKafkaTopic deletes topic, every topic named after it (topic.*: the
// sidecar's retry, dead-letter and ledger topics) and the groups of
// KafkaGroup(topic), as far as the broker allows within 30s: a clean-up,
// which reports nothing.
func DropKafkaTopic(adm *kadm.Client, topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, _ := adm.ListTopics(ctx)
	var drop []string
	for _, name := range list.Names() {
		if name == topic || strings.HasPrefix(name, topic+".") {
			drop = append(drop, name)
		}
	}
	_, _ = adm.DeleteTopics(ctx, drop...)
	// The group (a consumer or share group), and the one its members
	// share their handed-out marks in (kafka.MarksGroup).
	_, _ = adm.DeleteGroups(ctx, KafkaGroup(topic), KafkaGroup(topic)+".handoff-marks",
		KafkaGroup(topic)+".retries") // a share group's retry readers (kafka.ShareRetryGroup)
}

// KafkaTopic creates a uniquely named topic (base-<random>) on the local
// Apache Kafka and deletes it, every topic derived from it (topic.*) and its
// group when the test ends. A missing broker fails the test: make brokers
// starts it. Under -short the test is skipped.
func KafkaTopic(t *testing.T, base string, partitions int32) ([]string, string) {
	t.Helper()
	SkipShort(t, "Apache Kafka")
	brokers := KafkaBrokers()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	var b [4]byte
	_, _ = rand.Read(b[:])
	topic := base + "-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		cl.Close()
		t.Fatalf("Apache Kafka at %v is required (scripts/kafka-local start): %v", brokers, err)
	}
	t.Cleanup(func() {
		defer cl.Close()
		DropKafkaTopic(adm, topic)
	})
	// A broker busy with its first use (creating its internal topics) can
	// take a while to give a new topic leaders; wait for them.
	for {
		list, err := adm.ListTopics(ctx, topic)
		d, ok := list[topic]
		if err == nil && ok && d.Err == nil && len(d.Partitions) == int(partitions) && leadersKnown(d) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s has no leaders after 30s: %v %v", topic, err, d.Err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return brokers, topic
}

func leadersKnown(d kadm.TopicDetail) bool {
	for _, p := range d.Partitions {
		if p.Leader < 0 || p.Err != nil {
			return false
		}
	}
	return true
}

// Produce writes recs and waits for the brokers to have them.
func Produce(t *testing.T, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	// A new topic may not be known to every broker yet: keep retrying that
	// for as long as the context allows.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.UnknownTopicRetries(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// KafkaShareMembers is how many members of the share group have an
// assignment; 0 while it cannot be described.
func KafkaShareMembers(t *testing.T, brokers []string, group string) int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ds, err := kadm.NewClient(cl).DescribeShareGroups(context.Background(), group)
	if err != nil {
		return 0
	}
	n := 0
	for _, m := range ds[group].Members {
		if len(m.Assignment) > 0 {
			n++
		}
	}
	return n
}
