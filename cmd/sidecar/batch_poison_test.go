package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// A poison message in batch mode: the app fails the whole request that
// carries it, as a handler that crashes on it does. The batch is split until
// the poison stands alone, so it alone is dead-lettered and every batch-mate
// is handled, once.

// poisonBatchApp answers a batch request with 500 when it holds a poison
// event, else 200 for each event, and counts what it saw.
type poisonBatchApp struct {
	poison []string
	srv    *httptest.Server

	mu       sync.Mutex
	requests int
	failed   int            // requests answered 500
	together int            // requests that held every poison
	handled  map[string]int // event id → times answered 200
}

func newPoisonBatchApp(t *testing.T, poison ...string) *poisonBatchApp {
	t.Helper()
	a := &poisonBatchApp{poison: poison, handled: map[string]int{}}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var events []struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(body, &events); err != nil {
			t.Errorf("app: batch body: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		held := 0
		for _, e := range events {
			if slices.Contains(a.poison, e.ID) {
				held++
			}
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.requests++
		if held == len(a.poison) && held > 1 {
			a.together++
		}
		if held > 0 {
			a.failed++
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "handler crashed")
			return
		}
		results := make([]map[string]any, len(events))
		for i, e := range events {
			a.handled[e.ID]++
			results[i] = map[string]any{"id": e.ID, "status": 200}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *poisonBatchApp) url() string { return a.srv.URL + "/events" }

// handledAll reports whether every id not poison was handled at least once.
func (a *poisonBatchApp) handledAll(ids []string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		if !slices.Contains(a.poison, id) && a.handled[id] == 0 {
			return false
		}
	}
	return true
}

// check fails unless every innocent message was handled exactly once and no
// poison was, and logs the requests made.
func (a *poisonBatchApp) check(t *testing.T, ids []string) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		want := 1
		if slices.Contains(a.poison, id) {
			want = 0
		}
		if n := a.handled[id]; n != want {
			t.Errorf("%s handled %d times, want %d", id, n, want)
		}
	}
	t.Logf("%d messages, poison %v: %d requests, %d of them failed; the poisons shared %d requests",
		len(ids), a.poison, a.requests, a.failed, a.together)
	if len(a.poison) > 1 && a.together == 0 {
		t.Errorf("the poisons never shared a batch: the test did not test two in one")
	}
}

// batchPoisonCase is one scenario: 200 messages, the poison ones at these
// positions (adjacent ones share a batch).
type batchPoisonCase struct {
	name   string
	poison []int
}

var batchPoisonCases = []batchPoisonCase{
	{"one poison", []int{77}},
	{"two poisons in one batch", []int{100, 101}},
}

const (
	batchPoisonMessages = 200
	batchPoisonTier     = 200 * time.Millisecond
)

// ids returns the scenario's event ids and the poison ones.
func (c batchPoisonCase) ids() (ids, poison []string) {
	for i := range batchPoisonMessages {
		id := fmt.Sprintf("m-%03d", i)
		ids = append(ids, id)
		if slices.Contains(c.poison, i) {
			poison = append(poison, id)
		}
	}
	return ids, poison
}

// batchPoisonConfig sets batch delivery and short retries on cfg: three
// attempts, so the poison is dead-lettered for max-attempts.
//
// The batches are full by construction: the broker's window (prefetch,
// max_in_flight) is one batch, and a batch waits long enough to fill, so
// the first batch is the first 16 messages, and each next one the 16 that
// the previous batch's settling let in, in the source's order. Adjacent
// poisons inside one such batch therefore share a request, however slowly a
// loaded machine lets each delivery reach the batch. Only the last, short
// batch and the poison's retry copies wait out max_wait.
func batchPoisonConfig(cfg *config.Config) {
	cfg.Handler.Batch = config.Batch{MaxMessages: 16, MaxWait: config.Duration(time.Second)}
	cfg.Handler.MaxConcurrency = 16
	for _, s := range cfg.Sources {
		if s.RabbitMQ != nil {
			s.RabbitMQ.Prefetch = 16
		}
		if s.Kafka != nil {
			s.Kafka.MaxInFlight = 16
		}
	}
	cfg.Retry.MaxAttempts = 3
}

func TestRabbitBatchPoisonAloneDeadLettered(t *testing.T) {
	t.Parallel()
	for _, tc := range batchPoisonCases {
		t.Run(tc.name, func(t *testing.T) {
			conn := dialRabbit(t)
			q := testQueue(t, conn, []time.Duration{batchPoisonTier})
			ids, poison := tc.ids()
			a := newPoisonBatchApp(t, poison...)
			cfg := testConfig(a.url(), q, batchPoisonTier)
			batchPoisonConfig(&cfg)

			// Published before the sidecar starts, as on Kafka below: the
			// batches follow the queue's order (batchPoisonConfig).
			var msgs []publishing
			for _, id := range ids {
				msgs = append(msgs, publishing{MessageId: id, ContentType: "application/json", Body: []byte(`{"n":"` + id + `"}`)})
			}
			publish(t, conn, q, msgs...)
			s := startSidecar(t, cfg)
			dlq := rabbitmq.DeadLetterQueue(q)
			testkit.Eventually(t, 30*time.Second, "every message handled and the poison dead-lettered", func() bool {
				return a.handledAll(ids) && len(readStream(t, conn, dlq)) == len(poison)
			})
			s.stop(t)

			a.check(t, ids)
			reasons := map[string]string{}
			for _, d := range readStream(t, conn, dlq) {
				id, _ := d.Headers[broker.HeaderEventID].(string)
				reasons[id], _ = d.Headers[broker.HeaderDeadReason].(string)
			}
			checkPoisonReasons(t, reasons, poison)
			if n := depth(t, conn, q); n != 0 {
				t.Errorf("source holds %d, want 0", n)
			}
		})
	}
}

func TestKafkaBatchPoisonAloneDeadLettered(t *testing.T) {
	t.Parallel()
	for _, b := range kafkaBackends() {
		for _, tc := range batchPoisonCases {
			t.Run(b.name+"/"+tc.name, func(t *testing.T) {
				// One partition: adjacent records reach the sidecar together.
				brokers, topic := b.topic(t, "batchpoison", 1)
				ids, poison := tc.ids()
				a := newPoisonBatchApp(t, poison...)
				cfg := kafkaConfig(a.url(), brokers, topic, batchPoisonTier)
				batchPoisonConfig(&cfg)

				var recs []*kgo.Record
				for _, id := range ids {
					recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(id), Value: []byte(`{"n":"` + id + `"}`),
						Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}, {Key: "content-type", Value: []byte("application/json")}}})
				}
				// Produced before the sidecar starts (a new group reads from
				// the start): no batch waits on records still being produced.
				produceKafka(t, brokers, recs...)
				s := startSidecar(t, cfg)
				dlq := kafka.DeadLetterTopic(topic, kafkaGroup(topic))
				testkit.Eventually(t, 60*time.Second, "every message handled and the poison dead-lettered", func() bool {
					return a.handledAll(ids) && len(readTopic(t, brokers, dlq)) == len(poison)
				})
				s.stop(t)

				a.check(t, ids)
				reasons := map[string]string{}
				for _, r := range readTopic(t, brokers, dlq) {
					reasons[header(r, broker.HeaderEventID)] = header(r, broker.HeaderDeadReason)
				}
				checkPoisonReasons(t, reasons, poison)
				checkCommittedAtLogEnd(t, brokers, topic)
			})
		}
	}
}

// checkPoisonReasons fails unless the dead letters are exactly the poison
// messages, each for max-attempts.
func checkPoisonReasons(t *testing.T, reasons map[string]string, poison []string) {
	t.Helper()
	if len(reasons) != len(poison) {
		t.Errorf("dead letters %v, want only %v", reasons, poison)
	}
	for _, id := range poison {
		if reasons[id] != "max-attempts" {
			t.Errorf("dead letter of %s: reason %q, want max-attempts (all: %v)", id, reasons[id], reasons)
		}
	}
}
