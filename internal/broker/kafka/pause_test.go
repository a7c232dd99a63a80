package kafka

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

// retryCopy is a record of a retry topic due at due.
func retryCopy(topic, id string, due time.Time) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(id), Value: []byte(id), Headers: []kgo.RecordHeader{
		{Key: broker.HeaderEventID, Value: []byte(id)},
		{Key: broker.HeaderHops, Value: []byte("1")},
		{Key: broker.HeaderNextDue, Value: []byte(due.UTC().Format(time.RFC3339Nano))},
	}}
}

func paused(c *Client, topic string) bool { return len(c.cl.PauseFetchPartitions(nil)[topic]) > 0 }

// Pausing a retry partition at a record that is not yet due rewinds its
// fetch position; the rewind must not move the commit past a record of the
// partition handed out before it and still in flight. franz-go's SetOffsets
// also sets the offset a mark-based commit sends, so rewinding to the record
// that is not due committed past the records before it: a crash, or a
// record handed back at shutdown, lost them.
func TestPauseDoesNotCommitPastRecordsInFlight(t *testing.T) {
	rt := RetryTopic("orders", "g", time.Second)
	addrs := cluster(t, "orders", rt)
	now := time.Now()
	produce(t, addrs,
		retryCopy(rt, "due-0", now.Add(-time.Second)),
		retryCopy(rt, "due-1", now.Add(-time.Second)),
		retryCopy(rt, "later", now.Add(time.Hour)))
	c := newClient(t, addrs, "orders", time.Second)
	run := startConsuming(c, nil)
	testkit.Eventually(t, 10*time.Second, "the retry partition paused at the record not due", func() bool { return paused(c, rt) })
	run.stop()
	ds := run.got()
	if len(ds) != 2 {
		t.Fatalf("%d records handed out, want the 2 due", len(ds))
	}
	_ = ds[0].Ack()
	_ = ds[1].Release() // handed back, as at shutdown: it holds the commit
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := committed(t, addrs, rt); got != 1 {
		t.Fatalf("committed offset %d, want 1: record 1 was handed back, never settled", got)
	}
}

// A static member restarted while its retry partitions were paused until
// their records were due takes the same partitions back and hands every copy
// out once due: nothing of the pause outlives the process, and the commit
// never passed a copy not handed out.
func TestStaticRestartWhilePausedDeliversEveryCopy(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		addrs := cluster(t, "orders", RetryTopic("orders", "g", 200*time.Millisecond))
		testStaticRestartWhilePaused(t, addrs, "orders", "g")
	})
	t.Run("apache", func(t *testing.T) {
		addrs, topic := brokertest.KafkaTopic(t, "paused", 3)
		group := brokertest.KafkaGroup(topic)
		createTopic(t, addrs, RetryTopic(topic, group, 200*time.Millisecond), 3)
		testStaticRestartWhilePaused(t, addrs, topic, group)
	})
}

func testStaticRestartWhilePaused(t *testing.T, addrs []string, topic, group string) {
	const copies = 30
	rt := RetryTopic(topic, group, 200*time.Millisecond)
	o := Options{Brokers: addrs, Topic: topic, Group: group, Tiers: []time.Duration{200 * time.Millisecond},
		InstanceID: "restart-test", SessionTimeout: 6 * time.Second, RevokeTimeout: time.Millisecond}

	// The first run: copies due in turn, some now and some in a moment, so
	// the partitions pause part way; half of what is handed out settles and
	// half is still in flight when the process stops without leaving.
	first := newClientWith(t, o)
	firstRun := startConsuming(first, nil)
	// Joining the group comes first, and is slow on a loaded machine: the
	// copies are made once the retry partitions are this member's, so the
	// ones due in a moment are not yet due when they are fetched.
	testkit.Eventually(t, 30*time.Second, "the retry partitions assigned", func() bool {
		first.mu.Lock()
		defer first.mu.Unlock()
		for tp := range first.parts {
			if tp.topic == rt {
				return true
			}
		}
		return false
	})
	now := time.Now()
	var recs []*kgo.Record
	for i := range copies {
		due := now.Add(-time.Second)
		if i%3 == 2 {
			due = now.Add(1500 * time.Millisecond)
		}
		recs = append(recs, retryCopy(rt, fmt.Sprintf("copy-%02d", i), due))
	}
	produce(t, addrs, recs...)
	testkit.Eventually(t, 30*time.Second, "a retry partition paused", func() bool { return paused(first, rt) })
	firstRun.stop()
	settled := map[string]bool{}
	for i, d := range firstRun.got() {
		if i%2 == 0 {
			settled[string(d.Message().Body)] = true
			_ = d.Ack()
		}
	}
	// Close to a crash: the client goes without leaving the group.
	first.crash()

	second := newClientWith(t, o)
	restarted := time.Now()
	secondRun := startConsuming(second, func(d broker.Delivery) { _ = d.Ack() })
	defer func() {
		secondRun.stop()
		_ = second.Close()
	}()
	missing := func() []string {
		seen := map[string]bool{}
		for _, d := range secondRun.got() {
			seen[string(d.Message().Body)] = true
		}
		var out []string
		for i := range copies {
			id := fmt.Sprintf("copy-%02d", i)
			if !settled[id] && !seen[id] {
				out = append(out, id)
			}
		}
		return out
	}
	testkit.Eventually(t, 20*time.Second, "every unsettled copy handed out after the restart", func() bool { return len(missing()) == 0 })
	t.Logf("restarted member handed out every unsettled copy %v after it started", time.Since(restarted).Round(10*time.Millisecond))
}

// consuming is a Consume running in a goroutine of the test's.
type consuming struct {
	mu     sync.Mutex
	ds     []broker.Delivery
	cancel context.CancelFunc
	done   chan struct{}
}

// startConsuming runs c.Consume, keeping every delivery and passing it to
// then, when set, until stop.
func startConsuming(c *Client, then func(broker.Delivery)) *consuming {
	ctx, cancel := context.WithCancel(context.Background())
	r := &consuming{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		_ = c.Consume(ctx, func(d broker.Delivery) {
			r.mu.Lock()
			r.ds = append(r.ds, d)
			r.mu.Unlock()
			if then != nil {
				then(d)
			}
		})
	}()
	return r
}

func (r *consuming) got() []broker.Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]broker.Delivery(nil), r.ds...)
}

// stop ends Consume and waits for it to return.
func (r *consuming) stop() {
	r.cancel()
	<-r.done
}

// crash stops c close to the way a killed process would: no leave (a static
// member's client does not leave the group when it closes) and its records
// in flight never settled. Not quite a kill: closing the franz-go client
// runs its revoke callback, which commits the marked offsets — which is what
// the commit-past bug needed to show; the binary's SIGKILL test
// (cmd/sidecar/kafka_restart_test.go) covers a real kill.
func (c *Client) crash() {
	c.once.Do(func() {
		close(c.closed)
		c.timers.Wait()
		c.cl.Close()
	})
}

func createTopic(t *testing.T, addrs []string, topic string, partitions int32) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create %s: %v", topic, err)
	}
}
