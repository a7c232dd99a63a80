package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

// What the dead-letter manager republishes through (deadletter.Republisher).
var _ interface {
	Republish(context.Context, *broker.Message, broker.Headers) error
} = (*Client)(nil)

// A replayed dead letter goes back to the source topic itself, with the
// replay's trail in place of every handoff-* header it came with, and the
// content type it is replayed with. A transactional client republishes
// outside its transactions, which go on committing.
func TestRepublishToTheSourceTopic(t *testing.T) {
	for _, tc := range []struct {
		name        string
		apache, txn bool
	}{
		{"kfake", false, false},
		{"kfake/transactional", false, true},
		{"apache", true, false},
		{"apache/transactional", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			brokers, topic := []string(nil), "orders"
			if tc.apache {
				brokers, topic = brokertest.KafkaTopic(t, "republish", 1)
			} else {
				brokers = cluster(t, topic)
			}
			o := Options{Brokers: brokers, Topic: topic, Group: brokertest.KafkaGroup(topic)}
			if tc.txn {
				o.TransactionalID = "republish-" + topic // unique on the shared broker
			}
			c := newClientWith(t, o)
			t.Cleanup(func() { _ = c.Close() })

			// As the dead-letter topic is read back, with a repaired body
			// of another type than the original's.
			msg := &broker.Message{Key: []byte("k-1"), Body: []byte(`{"fixed":true}`), ContentType: "application/json",
				Headers: broker.Headers{"x-tenant": "acme", contentTypeHeader: "text/plain",
					broker.HeaderEventID: "evt-1", broker.HeaderAttempt: "3", broker.HeaderHops: "2",
					broker.HeaderDeadReason: "permanent", broker.HeaderReplayID: "an-older-replay"}}
			trail := broker.Headers{broker.HeaderEventID: "evt-1", broker.HeaderReplayID: "r-1",
				broker.HeaderReplayOf: DeadLetterTopic(topic, o.Group) + "/0/7"}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := c.Republish(ctx, msg, trail); err != nil {
				t.Fatal(err)
			}

			d := consume(t, c, 1, 20*time.Second)[0]
			m := d.Message()
			if string(m.Key) != "k-1" || string(m.Body) != `{"fixed":true}` || m.ContentType != "application/json" || m.Copy {
				t.Errorf("copy key %q body %q content type %q copy %v; want it as republished, on the source", m.Key, m.Body, m.ContentType, m.Copy)
			}
			want := map[string]string{"x-tenant": "acme", contentTypeHeader: "application/json"}
			for k, v := range trail {
				want[k] = v
			}
			r := m.Native.(*kgo.Record)
			if len(r.Headers) != len(want) {
				t.Errorf("copy headers %v, want exactly %v", r.Headers, want)
			}
			for _, h := range r.Headers {
				if want[h.Key] != string(h.Value) {
					t.Errorf("header %s = %q, want %q", h.Key, h.Value, want[h.Key])
				}
			}

			// The client's own work goes on: a transactional transfer
			// still commits, the offset with it.
			copyTrail := broker.Headers{broker.HeaderEventID: "evt-1", broker.HeaderReplayID: "r-1", broker.HeaderHops: "1"}
			if err := c.Transfer(ctx, broker.Destination{DeadLetter: true}, m, copyTrail); err != nil {
				t.Fatalf("transfer after a republish: %v", err)
			}
			_ = d.Ack()
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			// A transaction's offsets become readable once its markers are
			// written, which the coordinator does after it answered.
			testkit.Eventually(t, 10*time.Second, "the republished record's offset committed", func() bool {
				return committedOf(t, brokers, o.Group, topic) == 1
			})
		})
	}
}

// Once closed, a transactional client makes no producer for a republish:
// it would outlive Close.
func TestRepublishAfterCloseFails(t *testing.T) {
	addrs := cluster(t, "orders")
	c := newClientWith(t, Options{Brokers: addrs, Topic: "orders", TransactionalID: "republish-closed"})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	err := c.Republish(context.Background(), &broker.Message{Body: []byte("b")}, broker.Headers{broker.HeaderEventID: "e"})
	if err == nil {
		t.Fatal("republish after Close succeeded")
	}
	if c.plain != nil {
		t.Error("a producer was made after Close")
	}
}

// committedOf is group's committed offset of topic's partition 0, or -1.
func committedOf(t *testing.T, brokers []string, group, topic string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// A group no member has joined yet has committed nothing (groupOffsets).
	offs, err := groupOffsets(context.Background(), kadm.NewClient(cl), group)
	if err != nil {
		t.Fatalf("fetch offsets of %s: %v", group, err)
	}
	o, ok := offs.Lookup(topic, 0)
	if !ok {
		return -1
	}
	return o.At
}
