package kafka

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

// awaitFences waits until every delivery's hand-out is durable, as the
// engine does before it calls the app.
func awaitFences(t *testing.T, ds []broker.Delivery) {
	t.Helper()
	for _, d := range ds {
		if ch := d.(broker.Fenced).Durable(); ch != nil {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Fatalf("the hand-out of %s never became durable", d.Message().Body)
			}
		}
	}
}

// A member that takes over partitions another member handed records out of
// flags those records Redelivered, though its own journal never saw them:
// the marks are shared through the group's marks group. A topic deleted and
// made again under the same name starts without marks, in the group and in
// the journal alike.
func TestSharedMarkFlagsAnotherMembersRepeats(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		t.Parallel()
		testSharedMark(t, cluster(t, "orders"), "orders", "g")
	})
	t.Run("apache", func(t *testing.T) {
		t.Parallel()
		addrs, topic := brokertest.KafkaTopic(t, "shared", 1)
		testSharedMark(t, addrs, topic, brokertest.KafkaGroup(topic))
	})
}

func testSharedMark(t *testing.T, addrs []string, topic, group string) {
	for i := range 5 {
		produce(t, addrs, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprint(i))})
	}
	first := &memMarks{m: map[string]int64{}}
	c := newClientWith(t, Options{Brokers: addrs, Topic: topic, Group: group, Marks: first, MaxInFlight: 8})
	ahead := c.markAhead()
	ds := consume(t, c, 5, 10*time.Second)
	awaitFences(t, ds)
	_ = ds[0].Ack()
	_ = ds[1].Ack()
	for _, d := range ds[2:] {
		_ = d.Release() // handed out, never settled: as a crash leaves them
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(adminClient(t, addrs))
	shared, err := adm.FetchOffsets(context.Background(), MarksGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := shared.Lookup(topic, 0); !ok || o.At != 4+ahead || o.Metadata == "" {
		t.Fatalf("shared mark = %+v (found %v), want offset %d with the topic's id", o, ok, 4+ahead)
	}

	// Another member, with a journal of its own (empty).
	last := 4 + ahead + 1 // the first offset past the mark
	for i := int64(5); i <= last; i++ {
		produce(t, addrs, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprint(i))})
	}
	second := &memMarks{m: map[string]int64{}}
	c2 := newClientWith(t, Options{Brokers: addrs, Topic: topic, Group: group, Marks: second, MaxInFlight: 256})
	ds = consume(t, c2, int(last-1), 10*time.Second)
	checkRedeliveredUpTo(t, ds, 4+ahead)
	awaitFences(t, ds)
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}

	// The topic deleted and made again: its records are new to everyone,
	// though the first member's journal and the group hold marks of the
	// topic before it.
	if _, err := adm.DeleteTopic(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	// Kafka drops a deleted topic's committed offsets; so does this, in
	// case the in-process broker keeps them.
	if _, err := adm.DeleteOffsets(context.Background(), group, kadm.TopicsSet{topic: {0: {}}}); err != nil {
		t.Logf("deleting the group's offsets of the deleted topic: %v", err)
	}
	waitTopicGone(t, adm, topic)
	if _, err := adm.CreateTopic(context.Background(), 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	// A shared mark of the topic before, as a broker that kept it would
	// hand it back: written for another topic id, it is not read.
	var stale kadm.Offsets
	stale.Add(kadm.Offset{Topic: topic, Partition: 0, At: 100, LeaderEpoch: -1, Metadata: "00112233445566778899aabbccddeeff"})
	// Refused until the client's metadata knows the new topic.
	testkit.Eventually(t, 10*time.Second, "a stale shared mark committed", func() bool {
		rs, err := adm.CommitOffsets(context.Background(), MarksGroup(group), stale)
		return err == nil && rs.Error() == nil
	})
	for i := range 3 {
		produce(t, addrs, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprint(i))})
	}
	c3 := newClientWith(t, Options{Brokers: addrs, Topic: topic, Group: group, Marks: first, MaxInFlight: 8})
	t.Cleanup(func() { _ = c3.Close() })
	for _, d := range consume(t, c3, 3, 10*time.Second) {
		if d.Message().Redelivered {
			t.Errorf("record %s of the topic made again says redelivered", d.Message().Body)
		}
		_ = d.Ack()
	}
}

// adminClient is a client for the test's admin requests, quick to learn of
// a topic made again.
func adminClient(t *testing.T, addrs []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func waitTopicGone(t *testing.T, adm *kadm.Client, topic string) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, "topic "+topic+" gone after its deletion", func() bool {
		td, err := adm.ListTopics(context.Background(), topic)
		return err == nil && !td.Has(topic)
	})
}

// checkRedeliveredUpTo fails unless exactly the deliveries at or below the
// offset mark (their bodies are their offsets) say Redelivered, and acks
// them all.
func checkRedeliveredUpTo(t *testing.T, ds []broker.Delivery, mark int64) {
	t.Helper()
	for _, d := range ds {
		m := d.Message()
		off, _ := strconv.ParseInt(string(m.Body), 10, 64)
		if want := off <= mark; m.Redelivered != want {
			t.Errorf("record %d: redelivered = %v, want %v", off, m.Redelivered, want)
		}
		_ = d.Ack()
	}
}
