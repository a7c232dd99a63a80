package kafka

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

// A new group with StartAtEnd takes only what is produced after it joined,
// on kfake and on Apache Kafka; a member that stopped before settling any
// of it starts again where the first one did, not at a later end.
func TestStartAtEnd(t *testing.T) {
	run := func(t *testing.T, addrs []string, topic string) {
		rec := func(v string) *kgo.Record { return &kgo.Record{Topic: topic, Value: []byte(v)} }
		produce(t, addrs, rec("before-1"), rec("before-2"))
		c := newClientWith(t, Options{Brokers: addrs, Topic: topic, Group: brokertest.KafkaGroup(topic), StartAtEnd: true, RevokeTimeout: 100 * time.Millisecond})
		// The client joins the group when made, and commits the end it
		// starts from before any fetch.
		testkit.Eventually(t, 30*time.Second, "the end committed", func() bool {
			return committedOf(t, addrs, brokertest.KafkaGroup(topic), topic) == 2
		})
		produce(t, addrs, rec("after-1"))
		got := consume(t, c, 1, 30*time.Second)
		if v := string(got[0].Message().Body); v != "after-1" {
			t.Fatalf("first record taken: %q, want after-1", v)
		}
		// Not settled; the member stops, another starts: the first end
		// holds, so after-1 comes again.
		_ = c.Close()
		produce(t, addrs, rec("after-2"))
		c2 := newClientWith(t, Options{Brokers: addrs, Topic: topic, Group: brokertest.KafkaGroup(topic), StartAtEnd: true, RevokeTimeout: 100 * time.Millisecond})
		t.Cleanup(func() { _ = c2.Close() })
		got = consume(t, c2, 2, 30*time.Second)
		if a, b := string(got[0].Message().Body), string(got[1].Message().Body); a != "after-1" || b != "after-2" {
			t.Errorf("after a restart: %q, %q; want after-1, after-2", a, b)
		}
	}
	t.Run("kfake", func(t *testing.T) {
		topic := fmt.Sprintf("start-at-end-%d", time.Now().UnixNano())
		run(t, cluster(t, topic), topic)
	})
	t.Run("apache", func(t *testing.T) {
		brokers, topic := brokertest.KafkaTopic(t, "start-at-end", 1)
		run(t, brokers, topic)
	})
}

// franz-go joins the group inside NewClient, so the offsets of a fresh
// group may be adjusted before the client is returned: startAtEnd waits for
// it instead of using a client not yet set.
func TestStartAtEndBeforeTheClientIsReturned(t *testing.T) {
	topic := fmt.Sprintf("start-at-end-early-%d", time.Now().UnixNano())
	addrs := cluster(t, topic)
	produce(t, addrs, &kgo.Record{Topic: topic, Value: []byte("before")})
	reached := make(chan struct{})
	var once sync.Once
	hooks := &madeHooks{
		startAtEnd: func() { once.Do(func() { close(reached) }) },
		made: func() {
			// Hold the client back until the group has joined and its
			// offsets are being adjusted.
			select {
			case <-reached:
			case <-time.After(30 * time.Second):
				t.Error("the offsets were not adjusted while NewClient's client was held back")
			}
		},
	}
	c := newClientWith(t, Options{Brokers: addrs, Topic: topic, Group: brokertest.KafkaGroup(topic), StartAtEnd: true,
		RevokeTimeout: 100 * time.Millisecond, hooks: hooks})
	t.Cleanup(func() { _ = c.Close() })
	testkit.Eventually(t, 30*time.Second, "the end committed", func() bool {
		return committedOf(t, addrs, brokertest.KafkaGroup(topic), topic) == 1
	})
	produce(t, addrs, &kgo.Record{Topic: topic, Value: []byte("after")})
	if v := string(consume(t, c, 1, 30*time.Second)[0].Message().Body); v != "after" {
		t.Fatalf("first record taken: %q, want after", v)
	}
}
