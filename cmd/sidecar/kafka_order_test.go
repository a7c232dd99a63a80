package main

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/testkit"
)

// orderWorkload produces a poison record (the app answers 500 until it is
// dead-lettered) followed by n good records over ten keys, in one partition,
// and returns the app.
func orderWorkload(t *testing.T, b kafkaBackend, ordering string, n int) (*app, []string, string) {
	t.Helper()
	brokers, topic := b.topic(t, "ordered-"+ordering, 1)
	a := newApp(t, func(w http.ResponseWriter, c call, _ []call) {
		if c.Header.Get("Ce-Id") == "poison" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	cfg := kafkaConfig(a.url(), brokers, topic, tier)
	cfg.Sources[0].Kafka.Ordering = broker.Ordering(ordering)
	cfg.Retry.MaxAttempts = 3
	startSidecar(t, cfg)

	recs := []*kgo.Record{{Topic: topic, Key: []byte("p"), Value: []byte("poison"),
		Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte("poison")}}}}
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i%10)), Value: []byte(strconv.Itoa(i)),
			Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(fmt.Sprintf("good-%04d", i))}}})
	}
	produceKafka(t, brokers, recs...)
	return a, brokers, topic
}

// goodCalls returns the good records' numbers in the order the app got them.
func goodCalls(a *app) []int {
	var out []int
	for _, c := range a.allCalls() {
		if id := c.Header.Get("Ce-Id"); strings.HasPrefix(id, "good-") {
			n, _ := strconv.Atoi(strings.TrimPrefix(id, "good-"))
			out = append(out, n)
		}
	}
	return out
}

func TestKafkaPartitionOrderPoisonThenGood(t *testing.T) {
	t.Parallel()
	for _, b := range kafkaBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testPartitionOrder(t, b)
		})
	}
}

func testPartitionOrder(t *testing.T, b kafkaBackend) {
	// Handed over one at a time, each after the one before is settled: a
	// chain of some five goroutine hand-offs a record, each of which waits
	// for a core on a machine the rest of the suite keeps busy (3 s alone
	// with the race detector for 1,000, over two minutes among the other
	// tests). 300 show the order as well.
	const n = 300
	a, brokers, topic := orderWorkload(t, b, "partition", n)
	testkit.Eventually(t, 120*time.Second, "every good record", func() bool { return len(goodCalls(a)) >= n })

	poison := a.callsFor("poison")
	if len(poison) != 3 {
		t.Fatalf("poison called %d times, want max_attempts=3 (retried in place)", len(poison))
	}
	for i := 1; i < len(poison); i++ {
		if gap := poison[i].At.Sub(poison[i-1].At); gap < tier {
			t.Errorf("in-place retry %d came %v after the previous attempt, want >= %v", i+1, gap, tier)
		}
	}
	calls := a.allCalls()
	firstGood := -1
	for i, c := range calls {
		if strings.HasPrefix(c.Header.Get("Ce-Id"), "good-") {
			firstGood = i
			break
		}
	}
	if firstGood < 3 {
		t.Errorf("a good record was handed over before the poison's last attempt (call %d)", firstGood)
	}
	got := goodCalls(a)
	for i, v := range got {
		if v != i {
			t.Fatalf("good record %d was the %d-th handed over: order broken", v, i)
		}
	}
	dlq := readTopic(t, brokers, kafka.DeadLetterTopic(topic, kafkaGroup(topic)))
	if len(dlq) != 1 || header(dlq[0], broker.HeaderDeadReason) != "max-attempts" {
		t.Errorf("DLQ holds %d records, want the poison with reason max-attempts", len(dlq))
	}
}

func TestKafkaKeyOrderPoisonDoesNotBlockOtherKeys(t *testing.T) {
	t.Parallel()
	for _, b := range kafkaBackends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testKeyOrder(t, b)
		})
	}
}

func testKeyOrder(t *testing.T, b kafkaBackend) {
	const n = 1000
	a, _, _ := orderWorkload(t, b, "key", n)
	testkit.Eventually(t, 60*time.Second, "every good record and the poison's last attempt", func() bool {
		return len(goodCalls(a)) >= n && len(a.callsFor("poison")) == 3
	})
	lastPoison := a.callsFor("poison")[2].At
	before := 0
	for _, c := range a.allCalls() {
		if strings.HasPrefix(c.Header.Get("Ce-Id"), "good-") && c.At.Before(lastPoison) {
			before++
		}
	}
	if before == 0 {
		t.Errorf("no good record was handed over while the poison was retried: other keys were blocked")
	}
	// Within a key, order holds.
	last := map[int]int{}
	for _, v := range goodCalls(a) {
		k := v % 10
		if prev, ok := last[k]; ok && v < prev {
			t.Fatalf("key k%d: record %d after %d", k, v, prev)
		}
		last[k] = v
	}
	t.Logf("%d of %d good records handed over while the poison (another key) was being retried", before, n)
}
