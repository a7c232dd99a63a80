package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/budget"
)

// TestCrashLoopUnderShareGroupDeliveryLimit is the crash loop on a share
// group whose brokers archive a record after three deliveries: one record
// of 30 makes its sidecar die (SIGKILL during the call) on every call, and
// the sidecar is started again on its journal each time. Every kill hands
// back whatever the member held, and each handing back counts towards the
// limit; the brokers would archive the killing record, unseen by anyone,
// on its third. It ends in the DLQ as delivery-limit instead, with its
// evidence, and every healthy record is handled, none dead-lettered.
//
// On kfake the limit is the brokers'; on the local Kafka it is the group's
// own config, which the sidecar reads at start.
func TestCrashLoopUnderShareGroupDeliveryLimit(t *testing.T) {
	t.Parallel()
	t.Run("kfake", func(t *testing.T) {
		t.Parallel()
		const topic = "loop"
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.BrokerConfigs(map[string]string{
			"group.share.delivery.count.limit":    "3",
			"group.share.record.lock.duration.ms": "2000",
			"group.share.session.timeout.ms":      "2000",
			"share.record.lock.sweep.interval.ms": "50",
		}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cluster.Close)
		shareCrashLoop(t, cluster.ListenAddrs(), topic, "workers")
	})
	t.Run("apache", func(t *testing.T) {
		t.Parallel()
		brokers, topic := realKafkaTopic(t, "loop", 1)
		group := kafkaGroup(topic)
		setGroupConfig(t, brokers, group, "share.delivery.count.limit", "3")
		shareCrashLoop(t, brokers, topic, group)
	})
}

// setGroupConfig sets one config of group on the brokers.
func setGroupConfig(t *testing.T, brokers []string, group, name, value string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := kafka.SetGroupConfig(context.Background(), cl, group, name, value); err != nil {
		t.Fatal(err)
	}
}

func shareCrashLoop(t *testing.T, brokers []string, topic, group string) {
	bin := sidecarBinary(t)

	a := newKillerApp(t, 0)
	cfgPath := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 8}
sources:
  - name: loop
    kafka: {brokers: [%q], topic: %q, share_group: %q}
retry: {max_attempts: 10, tiers: [%s], base: 50ms, cap: 200ms}
telemetry: {metrics_listen: ""}
journal: {path: %q}
`, a.url(), strings.Join(brokers, ","), topic, group, killTier, filepath.Join(t.TempDir(), "handoff.db")))

	var ids []string
	var recs []*kgo.Record
	for i := range 30 {
		id := fmt.Sprintf("ok-%d", i)
		if i == 10 {
			id = "killer"
		}
		ids = append(ids, id)
		recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}})
	}
	produceKafka(t, brokers, recs...)

	dlq := kafka.DeadLetterTopic(topic, group)
	done := func() bool {
		handled := a.handled()
		return handled >= len(ids)-1 && len(readTopic(t, brokers, dlq)) > 0
	}
	var logs bytes.Buffer
	starts := restartUntil(t, bin, cfgPath, a, &logs, done)

	if !strings.Contains(logs.String(), `"delivery_count_limit":3`) {
		t.Errorf("the sidecar did not read the delivery limit of 3; log:\n%s", tail(logs.String(), 20))
	}
	var dead []string
	for _, r := range readTopic(t, brokers, dlq) {
		id, reason := header(r, broker.HeaderEventID), header(r, broker.HeaderDeadReason)
		dead = append(dead, id+"/"+reason)
		if id != "killer" {
			t.Errorf("healthy record %s dead-lettered (%s)", id, reason)
		}
		if id == "killer" && reason != string(budget.ReasonDeliveryLimit) {
			t.Errorf("the killing record dead-lettered as %q, want %q", reason, budget.ReasonDeliveryLimit)
		}
		if id == "killer" && !strings.Contains(header(r, broker.HeaderError), "the sidecar stopped during") {
			t.Errorf("the killing record's dead letter says %q, want the stops as its evidence", header(r, broker.HeaderError))
		}
	}
	if len(dead) != 1 {
		t.Errorf("dead letters %v, want the killing record once", dead)
	}
	for _, id := range ids {
		if id != "killer" && !a.succeeded(id) {
			t.Errorf("lost: %s was never handled", id)
		}
	}
	t.Logf("%d starts, %d calls of the killing record, dead letters %v", starts, a.killerCalls(), dead)
	if t.Failed() {
		path := filepath.Join(os.TempDir(), "handoff-"+strings.ReplaceAll(t.Name(), "/", "-")+".log")
		_ = os.WriteFile(path, logs.Bytes(), 0o644)
		t.Logf("log in %s", path)
	}
}
