package main

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker/brokertest"
)

// kafkaLocal runs scripts/kafka-local with args.
func kafkaLocal(t *testing.T, args ...string) {
	t.Helper()
	brokertest.SkipShort(t, "Apache Kafka")
	out, err := exec.Command(filepath.Join("..", "..", "scripts", "kafka-local"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/kafka-local %v: %v\n%s", args, err, out)
	}
}

// TestKafkaBrokerFailover streams records through the sidecar from a
// three-broker Apache Kafka cluster (replication 3, min.insync.replicas 2)
// and stops one broker mid-stream: nothing is lost.
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

	a := newApp(t, func(w http.ResponseWriter, _ call, _ []call) {
		time.Sleep(2 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	})
	cfg := kafkaConfig(a.url(), brokers, topic, time.Second)
	startSidecar(t, cfg)

	// Produce steadily while a broker goes away.
	const n = 2000
	produced := make(chan error, 1)
	go func() {
		for i := range n {
			rec := &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(i % 30)), Value: []byte(fmt.Sprint(i)),
				Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(fmt.Sprintf("f-%05d", i))}}}
			if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
				produced <- fmt.Errorf("record %d: %w", i, err)
				return
			}
			time.Sleep(time.Millisecond)
		}
		produced <- nil
	}()
	waitFor(t, 60*time.Second, "a third of the stream", func() bool { return len(a.allCalls()) >= n/3 })
	kafkaLocal(t, "stop-node", "2")
	stoppedAt := len(a.allCalls())
	if err := <-produced; err != nil {
		t.Fatalf("producing while a broker was down: %v", err)
	}
	seen := func() map[string]int {
		m := map[string]int{}
		for _, c := range a.allCalls() {
			m[c.Header.Get("Ce-Id")]++
		}
		return m
	}
	waitFor(t, 90*time.Second, "every record", func() bool { return len(seen()) == n })
	dups := 0
	for _, k := range seen() {
		dups += k - 1
	}
	t.Logf("%d records, broker 2 stopped after %d calls: every record handed over, %d twice", n, stoppedAt, dups)
	if stoppedAt >= n {
		t.Fatal("the stream ended before the broker stopped; the test proves nothing")
	}
}
