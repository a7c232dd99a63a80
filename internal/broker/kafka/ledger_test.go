package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
)

// The ledger topic is created beside the dead-letter topic, with one
// partition and the same retention; it is appended to and read back from
// any offset, and so is the dead-letter topic, partition by partition.
func TestTopicLogs(t *testing.T) {
	ctx := context.Background()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addrs := c.ListenAddrs()
	cl := newClientWith(t, Options{Brokers: addrs, Topic: "orders", DeadLetterRetention: time.Hour})
	raw, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	adm := kadm.NewClient(raw)
	details, err := adm.ListTopics(ctx, LedgerTopic("orders", "g"))
	if err != nil {
		t.Fatal(err)
	}
	if d := details["orders.g.dlq.ledger"]; d.Err != nil || len(d.Partitions) != 1 {
		t.Fatalf("ledger topic: %+v", d)
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, LedgerTopic("orders", "g"))
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := rcs.On(LedgerTopic("orders", "g"), nil); err != nil || !hasConfig(rc, "retention.ms", "3600000") {
		t.Fatalf("ledger retention: %+v %v", rc, err)
	}

	led, err := cl.LedgerLog()
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	for i := range 3 {
		if err := led.Append(ctx, []byte(fmt.Sprintf(`{"n":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	read := func(log *TopicLog, from map[int32]int64) string {
		t.Helper()
		var got []string
		err := log.Read(ctx, from, func(p int32, off int64, at time.Time, m *broker.Message) error {
			if at.IsZero() {
				t.Error("no time")
			}
			got = append(got, fmt.Sprintf("%d/%d:%s", p, off, m.Body))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(got)
	}
	if got := read(led, nil); got != `[0/0:{"n":0} 0/1:{"n":1} 0/2:{"n":2}]` {
		t.Fatalf("ledger from first: %s", got)
	}
	if got := read(led, map[int32]int64{0: 2}); got != `[0/2:{"n":2}]` {
		t.Fatalf("ledger from 2: %s", got)
	}
	if got := read(led, map[int32]int64{0: 3}); got != `[]` {
		t.Fatalf("ledger from its end: %s", got)
	}
	stop := errors.New("stop")
	if err := led.Read(ctx, nil, func(int32, int64, time.Time, *broker.Message) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("an error from each: %v", err)
	}

	dlq := cl.DeadLetterLog()
	for i := range 3 {
		r := &kgo.Record{Topic: dlq.Name(), Partition: int32(i % 2), Value: []byte(fmt.Sprint("body-", i)),
			Headers: []kgo.RecordHeader{{Key: broker.HeaderEventID, Value: []byte(fmt.Sprint("ev-", i))}, {Key: "content-type", Value: []byte("text/plain")}}}
		if err := produceTo(ctx, addrs, r); err != nil {
			t.Fatal(err)
		}
	}
	var msgs []*broker.Message
	if err := dlq.Read(ctx, map[int32]int64{1: 0}, func(_ int32, _ int64, _ time.Time, m *broker.Message) error {
		msgs = append(msgs, m)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 3 || msgs[0].Headers[broker.HeaderEventID] == "" || msgs[0].ContentType != "text/plain" {
		t.Fatalf("dead letters read: %+v", msgs)
	}
	first, err := dlq.First(ctx)
	if err != nil || len(first) != 2 || first[0] != 0 || first[1] != 0 {
		t.Fatalf("first %v, %v", first, err)
	}
	if err := dlq.Append(ctx, nil); err == nil {
		t.Fatal("appended to a log opened to read")
	}
}

func hasConfig(rc kadm.ResourceConfig, key, value string) bool {
	for _, c := range rc.Configs {
		if c.Key == key && c.Value != nil && *c.Value == value {
			return true
		}
	}
	return false
}

// produceTo produces r to its own partition.
func produceTo(ctx context.Context, addrs []string, r *kgo.Record) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, r).FirstErr()
}

// A ledger topic of more partitions than one has no one order: the sidecar
// refuses it rather than let replicas disagree.
func TestDeclareRefusesALedgerOfManyPartitions(t *testing.T) {
	ctx := context.Background()
	addrs := cluster(t, "orders")
	raw, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := kadm.NewClient(raw).CreateTopic(ctx, 3, -1, nil, LedgerTopic("orders", "g")); err != nil {
		t.Fatal(err)
	}
	cl, err := New(Options{Name: "test", Brokers: addrs, Topic: "orders", Group: "g", Declare: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Close() }()
	if err := cl.Declare(ctx); err == nil || !strings.Contains(err.Error(), "has 3 partitions; it needs one") {
		t.Fatalf("Declare = %v", err)
	}
}
