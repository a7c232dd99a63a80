package kafka

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

// A static member that stops cleanly leaves the group: its partitions move
// to the other member at once, not after its session timeout (45 s here),
// which is all that closing a static member's client would give them.
func TestCloseLeavesTheGroupAsStaticMember(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		testCloseLeaves(t, c.ListenAddrs(), "orders", "g")
	})
	t.Run("apache", func(t *testing.T) {
		addrs, topic := brokertest.KafkaTopic(t, "leave", 4)
		testCloseLeaves(t, addrs, topic, brokertest.KafkaGroup(topic))
	})
}

func testCloseLeaves(t *testing.T, addrs []string, topic, group string) {
	o := func(id string) Options {
		return Options{Brokers: addrs, Topic: topic, Group: group, InstanceID: id, SessionTimeout: 45 * time.Second}
	}
	owned := func(c *Client) int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.parts)
	}
	a := newClientWith(t, o("member-a"))
	aRun := startConsuming(a, nil)
	testkit.Eventually(t, 20*time.Second, "the first member to own every partition", func() bool { return owned(a) == 4 })
	b := newClientWith(t, o("member-b"))
	bRun := startConsuming(b, nil)
	defer func() {
		bRun.stop()
		_ = b.Close()
	}()
	testkit.Eventually(t, 20*time.Second, "the partitions shared by both members", func() bool { return owned(a) > 0 && owned(b) > 0 && owned(a)+owned(b) == 4 })

	aRun.stop()
	stopped := time.Now()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the member left to own every partition", func() bool { return owned(b) == 4 })
	t.Logf("the stopped member's partitions moved %v after its Close began", time.Since(stopped).Round(10*time.Millisecond))
}
