package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// The RabbitMQ outcome contract, through a Kafka source (kfake: franz-go's
// in-process cluster speaking the real protocol).

// kafkaBackend is a Kafka to run a test against: kfake (in-process) or the
// local Apache Kafka that make brokers starts.
type kafkaBackend struct {
	name string
	// topic creates a topic of its own for the test and returns the brokers
	// and its name.
	topic func(t *testing.T, base string, partitions int32) ([]string, string)
}

func kafkaBackends() []kafkaBackend {
	return []kafkaBackend{
		{"kfake", func(t *testing.T, base string, partitions int32) ([]string, string) {
			return kafkaCluster(t, base, partitions), base
		}},
		{"apache", realKafkaTopic},
	}
}

func kafkaCluster(t *testing.T, topic string, partitions int32) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// realKafkaTopic is a topic of the test's own on the local Apache Kafka.
func realKafkaTopic(t *testing.T, base string, partitions int32) ([]string, string) {
	t.Helper()
	return brokertest.KafkaTopic(t, base, partitions)
}

// kafkaGroup is the consumer group the tests use for topic.
func kafkaGroup(topic string) string { return brokertest.KafkaGroup(topic) }

func kafkaConfig(appURL string, brokers []string, topic string, tiers ...time.Duration) config.Config {
	cfg := testConfig(appURL, "unused", tiers...)
	declare := true
	cfg.Sources = []config.Source{{Name: "test", Kafka: &config.Kafka{
		Brokers: brokers, Topic: topic, Group: kafkaGroup(topic), Ordering: "none", Declare: &declare, MaxInFlight: 64,
	}}}
	return cfg
}

func produceKafka(t *testing.T, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	brokertest.Produce(t, brokers, recs...)
}

// readTopic returns every record in topic that a read-committed consumer
// sees: copies of aborted transactions and transaction markers are left out.
func readTopic(t *testing.T, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	end, err := kadm.NewClient(cl).ListCommittedOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	left := map[int32]int64{}
	end.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	var out []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(left) > 0 {
		f := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d records of %s; partitions not read to their end: %v", len(out), topic, left)
		}
		for _, r := range f.Records() {
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
			if e, ok := left[r.Partition]; ok && r.Offset+1 >= e {
				delete(left, r.Partition)
			}
		}
	}
	return out
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func TestKafkaOutcomeContract(t *testing.T) {
	t.Parallel()
	for _, b := range kafkaBackends() {
		// The same contract against an HTTP app and against a gRPC app
		// that says the same with outcomes and status codes.
		for _, tr := range []string{"http", "grpc"} {
			t.Run(b.name+"/"+tr, func(t *testing.T) {
				t.Parallel()
				brokers, topic := b.topic(t, "orders", 3)
				testKafkaOutcomeContract(t, tr, brokers, topic, false, 0)
			})
			// The same contract with batch delivery: every message of a batch
			// keeps its own outcome, retry and dead-letter path.
			t.Run(b.name+"/"+tr+"/batch", func(t *testing.T) {
				t.Parallel()
				brokers, topic := b.topic(t, "batchorders", 3)
				testKafkaOutcomeContract(t, tr, brokers, topic, false, 8)
			})
		}
		// The same contract with every copy committed in a transaction
		// together with its record's offset.
		t.Run(b.name+"/transactional", func(t *testing.T) {
			t.Parallel()
			brokers, topic := b.topic(t, "txorders", 3)
			testKafkaOutcomeContract(t, "http", brokers, topic, true, 0)
		})
	}
}

func testKafkaOutcomeContract(t *testing.T, transport string, brokers []string, topic string, transactional bool, batch int) {
	const tierD = 400 * time.Millisecond
	a, url := scriptApp(t, transport, contractScript)
	cfg := kafkaConfig(url, brokers, topic, tierD, 2*tierD)
	cfg.Retry.MaxAttempts = 3
	cfg.Sources[0].Kafka.TransactionalTransfer = transactional
	cfg.Handler.Batch = config.Batch{MaxMessages: batch, MaxWait: config.Duration(20 * time.Millisecond)}
	s := startSidecar(t, cfg)

	forged := []kgo.RecordHeader{{Key: broker.HeaderAttempt, Value: []byte("7")}, {Key: broker.HeaderDeadline, Value: []byte("2000-01-01T00:00:00.000Z")}}
	rec := func(id string, hs ...kgo.RecordHeader) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte("key-" + id), Value: []byte("body-" + id),
			Headers: append([]kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}, hs...)}
	}
	produceKafka(t, brokers, rec("ok", forged...), rec("flaky"), rec("poison"), rec("broken"), rec("later"))
	dlq := kafka.DeadLetterTopic(topic, kafkaGroup(topic))
	testkit.Eventually(t, 30*time.Second, "every outcome", func() bool {
		return len(a.callsFor("ok")) == 1 && len(a.callsFor("flaky")) == 2 && len(a.callsFor("later")) == 2 &&
			len(a.callsFor("broken")) == 3 && len(a.callsFor("poison")) == 1
	})
	testkit.Eventually(t, 10*time.Second, "two DLQ records", func() bool { return len(readTopic(t, brokers, dlq)) == 2 })
	time.Sleep(3 * tierD)
	s.stop(t)

	if c := a.callsFor("ok")[0]; c.Header.Get("Handoff-Attempt") != "1" {
		t.Errorf("forged handoff-attempt reached the app: %s", c.Header.Get("Handoff-Attempt"))
	}
	flaky := a.callsFor("flaky")
	if len(flaky) != 2 || flaky[1].Header.Get("Handoff-Attempt") != "2" || flaky[1].At.Sub(flaky[0].At) < tierD {
		t.Errorf("transient then success: %d calls, attempt %q, gap %v (want 2, 2, >= %v)",
			len(flaky), flaky[len(flaky)-1].Header.Get("Handoff-Attempt"), flaky[len(flaky)-1].At.Sub(flaky[0].At), tierD)
	}
	if later := a.callsFor("later"); later[1].At.Sub(later[0].At) < time.Second {
		t.Errorf("Retry-After: 1 not honoured: second call %v after the first", later[1].At.Sub(later[0].At))
	}
	if n := len(a.callsFor("broken")); n != 3 {
		t.Errorf("500 forever: %d calls, want max_attempts=3", n)
	}
	reasons := map[string]string{}
	for _, r := range readTopic(t, brokers, dlq) {
		id := header(r, broker.HeaderEventID)
		reasons[id] = header(r, broker.HeaderDeadReason)
		if string(r.Key) != "key-"+id || string(r.Value) != "body-"+id || header(r, "ce_id") != id {
			t.Errorf("DLQ record of %s lost its key, value or headers: %q %q", id, r.Key, r.Value)
		}
		if r.Attrs.IsTransactional() != transactional {
			t.Errorf("DLQ record of %s: written in a transaction = %v, want %v", id, r.Attrs.IsTransactional(), transactional)
		}
	}
	if reasons["poison"] != "permanent" || reasons["broken"] != "max-attempts" {
		t.Errorf("DLQ reasons = %v, want poison: permanent, broken: max-attempts", reasons)
	}

	if batch > 0 && a.largestBatch() < 2 {
		t.Errorf("batch delivery on, but no request carried more than %d event", a.largestBatch())
	}
	if batch == 0 && a.largestBatch() > 0 {
		t.Error("a batch request with batch delivery off")
	}

	// After a graceful stop the group's committed offsets are the log end:
	// no lag, nothing skipped.
	checkCommittedAtLogEnd(t, brokers, topic)
}

// checkCommittedAtLogEnd fails unless the test group's committed offset of
// every partition of topic is the partition's log end.
func checkCommittedAtLogEnd(t *testing.T, brokers []string, topic string) {
	t.Helper()
	// An offset committed in a transaction becomes visible once the
	// coordinator has written the commit markers, a moment after the
	// transaction ended: look again for a while before calling it missing.
	var behind []string
	for deadline := time.Now().Add(30 * time.Second); ; {
		behind = committedBehind(t, brokers, topic)
		if len(behind) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, b := range behind {
		t.Error(b)
	}
}

// committedBehind lists the partitions of topic whose committed offset in
// the test group is not the partition's log end.
func committedBehind(t *testing.T, brokers []string, topic string) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	offs, err := adm.FetchOffsets(context.Background(), kafkaGroup(topic))
	if err != nil {
		t.Fatal(err)
	}
	var behind []string
	ends.Each(func(e kadm.ListedOffset) {
		if got, _ := offs.Lookup(topic, e.Partition); got.At != e.Offset {
			behind = append(behind, fmt.Sprintf("partition %d: committed %d, log end %d", e.Partition, got.At, e.Offset))
		}
	})
	return behind
}
