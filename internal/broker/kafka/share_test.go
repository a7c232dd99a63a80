package kafka

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

// shareCluster is a kfake cluster whose share groups lock a record for lock
// and archive it after limit deliveries, with locks swept often.
func shareCluster(t *testing.T, lock time.Duration, limit int, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topics...), kfake.BrokerConfigs(map[string]string{
		"group.share.record.lock.duration.ms": strconv.FormatInt(lock.Milliseconds(), 10),
		"group.share.delivery.count.limit":    strconv.Itoa(limit),
		"share.record.lock.sweep.interval.ms": "50",
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// shareMember is one member of the share group g on topic, consuming until
// the test ends (or stop); its deliveries arrive on the returned channel.
func shareMember(t *testing.T, brokers []string, topic, group string, window int) (*Client, <-chan broker.Delivery, func()) {
	t.Helper()
	c, err := New(Options{Name: "share", Brokers: brokers, Topic: topic, Group: group, Share: true, Declare: true,
		MaxInFlight: window, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Declare(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan broker.Delivery, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		_ = c.ShareSource().Consume(ctx, func(d broker.Delivery) { out <- d })
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done; _ = c.Close() }) }
	t.Cleanup(stop)
	return c, out, stop
}

func next(t *testing.T, ch <-chan broker.Delivery, within time.Duration) broker.Delivery {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(within):
		t.Fatalf("no delivery within %v", within)
		return nil
	}
}

// The group's limit and lock are read at declare, from the brokers when the
// group sets none of its own; a record is flagged redelivered from its
// second delivery, and the last but one before the limit says it is final,
// so the engine moves it out instead of calling it, with a delivery to
// spare. A member that stops without settling a record hands it back to
// the group.
func TestShareDeliveryCountAndLimit(t *testing.T) {
	brokers := shareCluster(t, 2*time.Second, 4, "limited")
	produce(t, brokers, &kgo.Record{Topic: "limited", Value: []byte("again")})
	for n := 1; n <= 3; n++ {
		c, ch, stop := shareMember(t, brokers, "limited", "g", 8)
		if limit, lock := c.ShareSource().Limits(); limit != 4 || lock != 2*time.Second || c.ShareSource().LimitsRead() != "brokers" {
			t.Fatalf("limits read: %d deliveries, lock %v, from %s; want the brokers' 4 and 2s", limit, lock, c.ShareSource().LimitsRead())
		}
		m := next(t, ch, 30*time.Second).Message()
		if string(m.Body) != "again" || m.Redelivered != (n > 1) || m.DeliveryCount != n-1 || m.FinalDelivery != (n == 3) {
			t.Fatalf("delivery %d: body %q, redelivered %v, count %d, final %v; want redelivered from the second, final on the third of four",
				n, m.Body, m.Redelivered, m.DeliveryCount, m.FinalDelivery)
		}
		stop() // unsettled: closing the client gives it back
	}
}

// A record whose call outlives the lock is renewed while it is held, so no
// other member gets it meanwhile; once accepted it is gone for good.
func TestShareLockRenewedWhileHeld(t *testing.T) {
	const lock = 2 * time.Second
	brokers := shareCluster(t, lock, 5, "slow")
	produce(t, brokers, &kgo.Record{Topic: "slow", Value: []byte("long call")})
	_, first, _ := shareMember(t, brokers, "slow", "g", 8)
	d := next(t, first, 30*time.Second)
	_, second, _ := shareMember(t, brokers, "slow", "g", 8)
	select {
	case other := <-second:
		t.Fatalf("another member got %q while the first held it past its lock", other.Message().Body)
	case <-time.After(4 * lock):
	}
	if n := d.(*shareDelivery).renewals.Load(); n < 2 {
		t.Fatalf("renewed %d times in four lock durations, want at least 2", n)
	}
	if err := d.Ack(); err != nil {
		t.Fatal(err)
	}
	select {
	case other := <-second:
		t.Fatalf("an accepted record came back: %q", other.Message().Body)
	case <-time.After(3 * lock):
	}
}

// More members than partitions: three on a one-partition topic of the
// local Kafka each take a substantial part of the work, and each record is
// handled once.
func TestShareMembersShareOnePartition(t *testing.T) {
	brokers, topic := brokertest.KafkaTopic(t, "share-members", 1)
	const n = 600
	group := brokertest.KafkaGroup(topic)
	var mu sync.Mutex
	seen := map[string]int{}
	per := make([]int, 3)
	for m := range per {
		_, ch, _ := shareMember(t, brokers, topic, group, 16)
		go func() {
			for d := range ch {
				time.Sleep(2 * time.Millisecond) // a call: the others poll meanwhile
				mu.Lock()
				seen[string(d.Message().Body)]++
				per[m]++
				mu.Unlock()
				_ = d.Ack()
			}
		}()
	}
	// Produced once all three have joined: the first alone would otherwise
	// take it all.
	testkit.Eventually(t, 30*time.Second, "three members in the group", func() bool {
		return brokertest.KafkaShareMembers(t, brokers, group) == 3
	})
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(strconv.Itoa(i))})
	}
	produce(t, brokers, recs...)
	testkit.Eventually(t, 60*time.Second, fmt.Sprintf("%d records handled", n), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	})
	mu.Lock()
	defer mu.Unlock()
	for body, k := range seen {
		if k != 1 {
			t.Errorf("record %s handled %d times", body, k)
		}
	}
	for m, k := range per {
		if k < n/10 {
			t.Errorf("member %d handled %d of %d records (%v); want each a substantial part", m, k, n, per)
		}
	}
}

// A share group's backlog is what its brokers count as not yet
// acknowledged: all of the topic before the group consumed, less each
// record accepted; what was produced is the topic's end.
func TestShareBacklog(t *testing.T) {
	brokers := shareCluster(t, 2*time.Second, 5, "backlog")
	var recs []*kgo.Record
	for i := range 10 {
		recs = append(recs, &kgo.Record{Topic: "backlog", Value: []byte(strconv.Itoa(i))})
	}
	produce(t, brokers, recs...)
	c, ch, _ := shareMember(t, brokers, "backlog", "g", 4)
	lag, produced, err := c.Backlog(context.Background())
	if err != nil || produced != 10 || lag != 10 {
		t.Fatalf("backlog before any ack: lag %d, produced %d, %v; want 10 and 10", lag, produced, err)
	}
	for range 4 {
		if err := next(t, ch, 30*time.Second).Ack(); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 30*time.Second, "the backlog down by the four accepted", func() bool {
		lag, _, err := c.Backlog(context.Background())
		return err == nil && lag == 6
	})
}
