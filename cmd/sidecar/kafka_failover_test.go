package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// kafkaLocal runs scripts/kafka-local with args.
func kafkaLocal(t *testing.T, args ...string) {
	t.Helper()
	localScript(t, "kafka-local", "Apache Kafka", args...)
}

// TestKafkaBrokerFailover streams a mixed workload through the sidecar from
// a three-broker Apache Kafka cluster (replication 3, min.insync.replicas 2)
// and, under load: stops one broker (a leader of some partitions) and
// starts it again; then, with a backlog in hand, kills the whole cluster (SIGKILL) and
// starts it again, as a single broker's restart would. Every record ends
// handled or (poison only) dead-lettered once, and every repeated call is
// flagged redelivered.
func TestKafkaBrokerFailover(t *testing.T) {
	t.Parallel()
	kafkaLocal(t, "start-cluster")
	t.Cleanup(func() { kafkaLocal(t, "stop-cluster") })
	brokers := []string{"127.0.0.1:19192", "127.0.0.1:19292", "127.0.0.1:19392"}

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topic := fmt.Sprintf("failover-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if resp, err := adm.CreateTopic(ctx, 3, 3, nil, topic); err != nil || resp.Err != nil {
		t.Fatalf("create topic: %v %v", err, resp.Err)
	}
	// The cluster's data outlives the test: its topics and the sidecar's
	// retry and dead-letter ones go, or every later start of the cluster
	// loads them all again (hundreds after a few dozen runs, past the
	// start's timeout). After the sidecar stops, before the cluster does.
	t.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return
		}
		defer cl.Close()
		brokertest.DropKafkaTopic(kadm.NewClient(cl), topic)
	})

	l := newLedgerApp(t, 2*time.Millisecond)
	cfg := kafkaConfig(l.url(), brokers, topic, time.Second)
	cfg.Retry.MaxAttempts = 10 // a call cut off by a failover is an attempt
	// Calls are held while the cluster stops: they must not time out.
	cfg.Handler.Timeout = config.Duration(2 * time.Minute)
	startSidecar(t, cfg)

	ids := mixedWorkload(2600)
	record := func(id string) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte(id[len(id)-2:]), Value: []byte(id),
			Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}}
	}
	// Produce steadily while a broker goes away and comes back: a third of
	// the stream before broker 2 stops, a third while it is down, a third
	// after it is back. Paced by the test, not by each write's round trip,
	// which on a loaded machine (three brokers' JVMs among the other tests)
	// once fell to a few writes a second; and the broker's stop and start
	// are the stream's own milestones, however long they take.
	const streamed = 2000
	produced := make(chan error, 1)
	down, up := make(chan struct{}), make(chan struct{})
	var downOnce, upOnce sync.Once
	t.Cleanup(func() { // a test that stops early does not leave the producer waiting
		downOnce.Do(func() { close(down) })
		upOnce.Do(func() { close(up) })
	})
	var sent atomic.Int64
	go func() {
		var wg sync.WaitGroup
		var first error
		var mu sync.Mutex
		for i, id := range ids[:streamed] {
			switch i {
			case streamed / 3:
				<-down
			case 2 * streamed / 3:
				<-up
			}
			wg.Add(1)
			cl.Produce(context.Background(), record(id), func(_ *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("record %d: %w", i, err)
					}
					mu.Unlock()
				}
				sent.Add(1)
			})
			time.Sleep(time.Millisecond) // a steady stream, not a burst
		}
		wg.Wait()
		produced <- first
	}()
	testkit.Eventually(t, 60*time.Second, "a third of the stream produced", func() bool { return sent.Load() >= streamed/3 })
	kafkaLocal(t, "stop-node", "2")
	stoppedAt := len(l.allCalls())
	downOnce.Do(func() { close(down) })
	testkit.Eventually(t, 60*time.Second, "a second third produced while broker 2 is down", func() bool { return sent.Load() >= 2*streamed/3 })
	kafkaLocal(t, "start-node", "2")
	upOnce.Do(func() { close(up) })
	if err := <-produced; err != nil {
		t.Fatalf("producing while a broker was down: %v", err)
	}

	// The whole cluster down and up with a backlog and calls in flight:
	// what a single broker's restart is.
	release := l.hold()
	calls := len(l.allCalls())
	for _, id := range ids[streamed:] {
		if err := cl.ProduceSync(context.Background(), record(id)).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", id, err)
		}
	}
	testkit.Eventually(t, 60*time.Second, "calls in flight", func() bool { return len(l.allCalls()) > calls })
	// All three killed at once, as a crash (or a power cut of the
	// processes alone) would: what a single broker's restart is, and faster
	// to wait for than a controlled shutdown without a quorum.
	phase := time.Now()
	kafkaLocal(t, "kill-cluster")
	release()
	restartedAt := l.handled()
	kafkaLocal(t, "start-cluster")
	t.Logf("the cluster was down and up again in %v", time.Since(phase).Round(time.Second))

	poison := len(ids) / 10
	dlq := kafka.DeadLetterTopic(topic, kafkaGroup(topic))
	testkit.Eventually(t, 180*time.Second, "every record handled or dead-lettered", func() bool {
		return l.handled() == len(ids)-poison && len(readTopic(t, brokers, dlq)) >= poison
	})
	dead := idsOf(readTopic(t, brokers, dlq), func(r *kgo.Record) string { return string(r.Value) })
	t.Logf("broker 2 stopped after %d calls and started again; the cluster stopped with %d of %d handled", stoppedAt, restartedAt, len(ids))
	if restartedAt >= len(ids)-poison {
		t.Error("the backlog was done before the cluster stopped; the restart proves nothing")
	}
	l.account(t, "Kafka broker lost and restarted, then the cluster restarted", ids, dead, 3*cfg.Sources[0].Kafka.MaxInFlight)
}
