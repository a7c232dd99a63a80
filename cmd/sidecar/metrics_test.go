package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// scrape reads the sidecar's /metrics as Prometheus parses it.
func scrape(t *testing.T, health string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + health + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not the Prometheus text format: %v", err)
	}
	return fams
}

// sample is the value of the family's sample whose labels include want;
// the sum over every such sample.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f, ok := fams[name]
	if !ok {
		return -1
	}
	total := 0.0
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		case m.Histogram != nil:
			total += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return total
}

// metricsScript answers ok-* 200, flaky-* 503 once then 200, bad-* 422.
// Each outcome kind counts where the test can see it: the app's calls, the
// retry tier, the dead-letter destination.
func metricsScript(w http.ResponseWriter, c call, prior []call) {
	id := c.Header.Get("Ce-Id")
	switch {
	case strings.HasPrefix(id, "bad"):
		w.WriteHeader(http.StatusUnprocessableEntity)
	case strings.HasPrefix(id, "flaky") && len(prior) == 0:
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
		w.WriteHeader(http.StatusOK)
	}
}

// The counters on /metrics match what the app saw and what reached the
// dead-letter destination, on each broker.
func TestMetricsMatchWhatHappened(t *testing.T) {
	t.Parallel()
	const ok, flaky, bad = 6, 4, 3
	var ids []string
	for i := range ok {
		ids = append(ids, fmt.Sprintf("ok-%d", i))
	}
	for i := range flaky {
		ids = append(ids, fmt.Sprintf("flaky-%d", i))
	}
	for i := range bad {
		ids = append(ids, fmt.Sprintf("bad-%d", i))
	}
	check := func(t *testing.T, a *app, s *inProcess) {
		testkit.Eventually(t, 30*time.Second, "every outcome", func() bool {
			fams := scrape(t, s.health)
			return sample(fams, "handoff_outcomes_total", map[string]string{"outcome": "success"}) == ok+flaky &&
				sample(fams, "handoff_deadletters_total", map[string]string{"reason": "permanent"}) == bad
		})
		fams := scrape(t, s.health)
		calls := len(a.allCalls())
		for name, want := range map[string]float64{
			"handoff_outcomes_total":           float64(calls),
			"handoff_handler_duration_seconds": float64(calls),
			"handoff_messages_received_total":  ok + 2*flaky + bad, // a flaky one comes back from its retry tier
			"handoff_retries_scheduled_total":  flaky,
			"handoff_deadletters_total":        bad,
		} {
			if got := sample(fams, name, map[string]string{"source": "test"}); got != want {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
		// Every failure here is a first attempt's; every re-attempt succeeds.
		if got := sample(fams, "handoff_outcomes_total", map[string]string{"attempt": "again", "outcome": "success"}); got != flaky {
			t.Errorf("re-attempts that succeeded = %v, want %v", got, flaky)
		}
		if got := sample(fams, "handoff_outcomes_total", map[string]string{"attempt": "first"}); got != ok+flaky+bad {
			t.Errorf("first attempts = %v, want %v", got, ok+flaky+bad)
		}
		// 503 is the app saying it is overloaded: retried, as overload.
		if got := sample(fams, "handoff_outcomes_total", map[string]string{"outcome": "overload"}); got != flaky {
			t.Errorf("overload outcomes = %v, want %v", got, flaky)
		}
		for _, name := range []string{"handoff_budget_tokens", "handoff_budget_denied_total", "handoff_concurrency_limit",
			"handoff_intake_paused", "handoff_oldest_unsettled_age_seconds", "handoff_journal_commit_duration_seconds",
			"handoff_deadletters_oldest_open_age_seconds", "handoff_build_info"} {
			if _, found := fams[name]; !found {
				t.Errorf("%s is not exported", name)
			}
		}
		// The dead letters' gauges follow the index: 3 pending.
		testkit.Eventually(t, 10*time.Second, "3 open dead letters", func() bool {
			return sample(scrape(t, s.health), "handoff_deadletters_open", map[string]string{"source": "test", "state": "pending"}) == bad
		})
		// The backlog is read back to empty; with nothing waiting, nothing
		// is left to drain.
		testkit.Eventually(t, 10*time.Second, "the backlog's gauges", func() bool {
			fams := scrape(t, s.health)
			return sample(fams, "handoff_backlog_messages", map[string]string{"source": "test"}) == 0 &&
				sample(fams, "handoff_backlog_drain_seconds", map[string]string{"source": "test"}) == 0 &&
				sample(fams, "handoff_completion_rate", map[string]string{"source": "test"}) >= 0 &&
				sample(fams, "handoff_arrival_rate", map[string]string{"source": "test"}) >= 0
		})
	}
	t.Run("rabbitmq", func(t *testing.T) {
		t.Parallel()
		conn := dialRabbit(t)
		t.Cleanup(func() { _ = conn.Close() })
		tier := 200 * time.Millisecond
		q := testQueue(t, conn, []time.Duration{tier})
		a := newApp(t, metricsScript)
		cfg := testConfig(a.url(), q, tier)
		cfg.Telemetry.DrainWindow = config.Duration(1200 * time.Millisecond) // a reading every 100ms
		s := startSidecar(t, cfg)
		var ms []publishing
		for _, id := range ids {
			ms = append(ms, publishing{MessageId: id, Body: []byte(id)})
		}
		publish(t, conn, q, ms...)
		check(t, a, s)
	})
	t.Run("kafka", func(t *testing.T) {
		t.Parallel()
		brokers, topic := realKafkaTopic(t, "metrics", 2)
		a := newApp(t, metricsScript)
		cfg := kafkaConfig(a.url(), brokers, topic, 200*time.Millisecond)
		cfg.Telemetry.MetricsListen = "127.0.0.1:0"
		cfg.Telemetry.DrainWindow = config.Duration(1200 * time.Millisecond)
		s := startSidecar(t, cfg)
		var recs []*kgo.Record
		for _, id := range ids {
			recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}})
		}
		produceKafka(t, brokers, recs...)
		check(t, a, s)
	})
}
