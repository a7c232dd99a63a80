package main

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/sidecar"
	"handoff.dev/handoff/internal/testkit"
)

// Each crash window of DESIGN §2 gets a test: the sidecar stops right there
// (a fault hook ends the hand-off as a crash would, then the process is
// stopped without it settling), restarts on the same journal, and the
// redelivered message must come out right. Without the journal each of these
// tests fails: a second app call, a second copy, or no crash at all.

var errCrash = errors.New("crash")

// crashOnce returns a fault hook that fires once, at w.
func crashOnce(w dispatch.Window) (func(dispatch.Window, journal.Key) error, *atomic.Bool) {
	var fired atomic.Bool
	return func(at dispatch.Window, _ journal.Key) error {
		if at == w && fired.CompareAndSwap(false, true) {
			return errCrash
		}
		return nil
	}, &fired
}

// crashConfig is testConfig with a journal that survives the restart.
func crashConfig(t *testing.T, appURL, q string) config.Config {
	cfg := testConfig(appURL, q, tier)
	cfg.Journal.Path = filepath.Join(t.TempDir(), "handoff.db")
	cfg.Shutdown.DrainTimeout = config.Duration(time.Second)
	return cfg
}

// timeline reads one event's records from the (closed) journal.
func timeline(t *testing.T, path, source, id string) []journal.Step {
	t.Helper()
	j, _, err := journal.Open(path, journal.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	steps, err := j.Timeline(journal.Key{Source: source, EventID: id})
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

func hasStep(steps []journal.Step, kind journal.Kind, detail string) bool {
	for _, s := range steps {
		if s.Kind == kind && strings.Contains(s.Detail, detail) {
			return true
		}
	}
	return false
}

// After the app answered 2xx and the journal recorded it, before the ack.
func TestCrashAfterSuccessBeforeAck(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, status(http.StatusOK))
	cfg := crashConfig(t, a.url(), q)
	fault, fired := crashOnce(dispatch.WindowHandled)
	s := startSidecarWith(t, cfg, sidecar.Options{Fault: fault})

	publish(t, conn, q, publishing{MessageId: "c-1", Body: []byte("x")})
	testkit.Eventually(t, 10*time.Second, "the crash", fired.Load)
	s.stop(t)
	testkit.Eventually(t, 5*time.Second, "the unacked message back in the queue", func() bool { return depth(t, conn, q) == 1 })

	back := depth(t, conn, q)
	s = startSidecar(t, cfg)
	waitSettled(t, s, back)
	s.stop(t)
	if got := depth(t, conn, q); got != 0 {
		t.Fatalf("source holds %d after the restart, want 0", got)
	}
	if n := len(a.callsFor("c-1")); n != 1 {
		t.Errorf("app called %d times, want 1: the journal said HANDLED", n)
	}
	if steps := timeline(t, cfg.Journal.Path, "test", "c-1"); !hasStep(steps, journal.Settled, "already handled") {
		t.Errorf("journal does not show the redelivery settled as handled: %+v", steps)
	}
}

// After a retry copy was published and confirmed by the broker, before the
// journal recorded the confirm: the copy is published again, and the retry
// consumer drops the second one without calling the app.
func TestCrashAfterPublishBeforeConfirm(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, func(w http.ResponseWriter, _ call, prior []call) {
		if len(prior) == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	cfg := crashConfig(t, a.url(), q)
	fault, fired := crashOnce(dispatch.WindowPublished)
	s := startSidecarWith(t, cfg, sidecar.Options{Fault: fault})

	publish(t, conn, q, publishing{MessageId: "c-2", Body: []byte("x")})
	testkit.Eventually(t, 10*time.Second, "the crash", fired.Load)
	s.stop(t)

	s = startSidecar(t, cfg)
	testkit.Eventually(t, 15*time.Second, "the retry", func() bool { return len(a.callsFor("c-2")) >= 2 })
	// Both copies (the one published before the crash and the one published
	// again after it) come back through the retry queue.
	retry := rabbitmq.RetryQueue(q)
	tierQ := rabbitmq.TierQueue(q, tier)
	testkit.Eventually(t, 10*time.Second, "both copies consumed", func() bool {
		return depth(t, conn, tierQ) == 0 && depth(t, conn, retry) == 0 && depth(t, conn, q) == 0
	})
	// One of them settled as a duplicate, and nothing left unsettled: the
	// second copy dropped (or, had the first sidecar taken the first copy
	// back before it stopped, the redelivered source settled because a
	// later copy exists).
	testkit.Eventually(t, 30*time.Second, "a duplicate settled and nothing unsettled", func() bool {
		fams := scrape(t, s.health)
		return sample(fams, "handoff_journal_duplicates_suppressed_total", nil) >= 1 &&
			sample(fams, "handoff_oldest_unsettled_age_seconds", nil) == 0
	})
	s.stop(t)
	if n := len(a.callsFor("c-2")); n != 2 {
		t.Errorf("app called %d times, want 2 (attempt 1, then one retry): the second copy must be dropped", n)
	}
	steps := timeline(t, cfg.Journal.Path, "test", "c-2")
	transferring := 0
	for _, st := range steps {
		if st.Kind == journal.Transferring {
			transferring++
		}
	}
	if transferring != 1 || !hasStep(steps, journal.Settled, "duplicate") {
		t.Errorf("journal should show one copy recorded and a duplicate settled: %+v", steps)
	}
	if n := len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))); n != 0 {
		t.Errorf("DLQ holds %d, want 0", n)
	}
}

// After the DLQ copy was confirmed and recorded, before the source ack: the
// redelivery is settled without a second DLQ copy.
func TestCrashAfterConfirmBeforeAck(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, status(http.StatusUnprocessableEntity))
	cfg := crashConfig(t, a.url(), q)
	fault, fired := crashOnce(dispatch.WindowConfirmed)
	s := startSidecarWith(t, cfg, sidecar.Options{Fault: fault})

	publish(t, conn, q, publishing{MessageId: "c-3", Body: []byte("x")})
	testkit.Eventually(t, 10*time.Second, "the crash", fired.Load)
	s.stop(t)
	testkit.Eventually(t, 5*time.Second, "the unacked message back in the queue", func() bool { return depth(t, conn, q) == 1 })

	back := depth(t, conn, q)
	s = startSidecar(t, cfg)
	waitSettled(t, s, back)
	s.stop(t)
	copies := readStream(t, conn, rabbitmq.DeadLetterQueue(q))
	if len(copies) != 1 {
		t.Errorf("DLQ holds %d copies, want exactly 1", len(copies))
	}
	if n := len(a.callsFor("c-3")); n != 1 {
		t.Errorf("app called %d times, want 1", n)
	}
	if got := depth(t, conn, q); got != 0 {
		t.Errorf("source holds %d, want 0", got)
	}
}

// After a DLQ copy reached the DLQ, before the journal recorded its confirm:
// the restart reads the DLQ stream back, finds the copy, and publishes no
// second one.
func TestCrashAfterPublishBeforeConfirmDLQ(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := newApp(t, status(http.StatusUnprocessableEntity))
	cfg := crashConfig(t, a.url(), q)
	var fired atomic.Bool
	fault := func(at dispatch.Window, k journal.Key) error {
		if at == dispatch.WindowPublished && k.EventID == "c-5" && fired.CompareAndSwap(false, true) {
			return errCrash
		}
		return nil
	}
	s := startSidecarWith(t, cfg, sidecar.Options{Fault: fault})

	// Dead letters of other events ahead of it: the read-back must look
	// past them, and leaves them all in the stream.
	for _, id := range []string{"other-1", "other-2", "c-5"} {
		publish(t, conn, q, publishing{MessageId: id, Body: []byte(id)})
	}
	testkit.Eventually(t, 10*time.Second, "the crash", fired.Load)
	s.stop(t)
	testkit.Eventually(t, 5*time.Second, "the unacked message back in the queue", func() bool { return depth(t, conn, q) >= 1 })

	back := depth(t, conn, q)
	s = startSidecar(t, cfg)
	waitSettled(t, s, back)
	s.stop(t)
	count := map[string]int{}
	for _, d := range readStream(t, conn, rabbitmq.DeadLetterQueue(q)) {
		count[d.MessageId]++
	}
	if len(count) != 3 || count["other-1"] != 1 || count["other-2"] != 1 || count["c-5"] != 1 {
		t.Errorf("DLQ copies by id = %v, want one of each", count)
	}
	if n := len(a.callsFor("c-5")); n != 1 {
		t.Errorf("app called %d times, want 1", n)
	}
	if steps := timeline(t, cfg.Journal.Path, "test", "c-5"); !hasStep(steps, journal.Transferred, "found at the destination") {
		t.Errorf("journal does not show the copy found at its destination: %+v", steps)
	}
}

// The journal writer fails in the middle of a batch (the process dies before
// the commit): the sidecar stops itself rather than go on without its
// journal; after a restart the message is handled, never lost.
func TestCrashMidJournalBatch(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	var armed atomic.Bool
	var once sync.Once
	fired := make(chan struct{})
	a := newApp(t, func(w http.ResponseWriter, _ call, _ []call) {
		armed.Store(true) // the next commit — this answer's — dies mid-batch
		w.WriteHeader(http.StatusOK)
	})
	cfg := crashConfig(t, a.url(), q)
	s := startSidecarWith(t, cfg, sidecar.Options{BeforeCommit: func(int) error {
		if armed.Load() {
			once.Do(func() { close(fired) })
			return errCrash
		}
		return nil
	}})

	publish(t, conn, q, publishing{MessageId: "c-4", Body: []byte("x")})
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("the journal writer never committed after the app answered")
	}
	if err := s.halt(); err == nil || !strings.Contains(err.Error(), "journal") {
		t.Fatalf("sidecar returned %v, want it to stop on the journal failure", err)
	}
	testkit.Eventually(t, 5*time.Second, "the unacked message back in the queue", func() bool { return depth(t, conn, q) == 1 })

	armed.Store(false)
	s = startSidecar(t, cfg)
	testkit.Eventually(t, 15*time.Second, "the message handled after the restart", func() bool {
		return depth(t, conn, q) == 0 && depth(t, conn, rabbitmq.RetryQueue(q)) == 0 &&
			depth(t, conn, rabbitmq.TierQueue(q, tier)) == 0 && len(a.callsFor("c-4")) >= 2
	})
	s.stop(t)
	calls := a.callsFor("c-4")
	if len(calls) != 2 {
		t.Errorf("app called %d times, want 2: the first answer was never made durable", len(calls))
	}
	if got := calls[len(calls)-1].Header.Get("Handoff-Redelivered"); got != "true" {
		t.Errorf("the call after the crash says Handoff-Redelivered %q, want true", got)
	}
	if n := len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))); n != 0 {
		t.Errorf("DLQ holds %d, want 0", n)
	}
}

// After a DLQ copy reached a Kafka topic, before the journal recorded its
// acknowledgement: the restart reads the topic back, finds the copy, and
// writes no second one.
func TestCrashAfterPublishBeforeConfirmKafka(t *testing.T) {
	t.Parallel()
	const topic = "crash"
	brokers := kafkaCluster(t, topic, 1)
	a := newApp(t, status(http.StatusUnprocessableEntity))
	cfg := kafkaConfig(a.url(), brokers, topic, tier)
	cfg.Journal.Path = filepath.Join(t.TempDir(), "handoff.db")
	cfg.Shutdown.DrainTimeout = config.Duration(time.Second)
	fault, fired := crashOnce(dispatch.WindowPublished)
	s := startSidecarWith(t, cfg, sidecar.Options{Fault: fault})

	produceKafka(t, brokers, &kgo.Record{Topic: topic, Value: []byte("x"), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte("k-1")}}})
	testkit.Eventually(t, 10*time.Second, "the crash", fired.Load)
	s.stop(t)

	s = startSidecar(t, cfg)
	dlq := kafka.DeadLetterTopic(topic, kafkaGroup(topic))
	// The restart resumes the record and settles it (it would have written
	// a second copy by then if it wrote one at all).
	waitSettled(t, s, 1)
	s.stop(t)
	if n := len(readTopic(t, brokers, dlq)); n != 1 {
		t.Errorf("DLQ topic holds %d copies, want exactly 1", n)
	}
	if n := len(a.callsFor("k-1")); n != 1 {
		t.Errorf("app called %d times, want 1", n)
	}
	if steps := timeline(t, cfg.Journal.Path, "test", "k-1"); !hasStep(steps, journal.Transferred, "found at the destination") {
		t.Errorf("journal does not show the copy found at its destination: %+v", steps)
	}
	checkCommittedAtLogEnd(t, brokers, topic)
}

// With transactional_transfer the copy and the record's offset commit
// together: after a crash between the commit and the journal's record of it,
// the record is not consumed again at all.
func TestCrashAfterPublishBeforeConfirmKafkaTransactional(t *testing.T) {
	t.Parallel()
	brokers, topic := realKafkaTopic(t, "txcrash", 1)
	a := newApp(t, status(http.StatusUnprocessableEntity))
	cfg := kafkaConfig(a.url(), brokers, topic, tier)
	cfg.Sources[0].Kafka.TransactionalTransfer = true
	cfg.Journal.Path = filepath.Join(t.TempDir(), "handoff.db")
	cfg.Shutdown.DrainTimeout = config.Duration(time.Second)
	fault, fired := crashOnce(dispatch.WindowPublished)
	s := startSidecarWith(t, cfg, sidecar.Options{Fault: fault})

	produceKafka(t, brokers, &kgo.Record{Topic: topic, Value: []byte("x"), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte("t-1")}}})
	testkit.Eventually(t, 20*time.Second, "the crash", fired.Load)
	s.stop(t)
	// The offset committed with the copy, before the crash.
	checkCommittedAtLogEnd(t, brokers, topic)

	s = startSidecar(t, cfg)
	// Nothing is left to resume: a bounded look that the restart writes no
	// second copy and makes no second call.
	time.Sleep(2 * time.Second)
	s.stop(t)
	if n := len(readTopic(t, brokers, kafka.DeadLetterTopic(topic, kafkaGroup(topic)))); n != 1 {
		t.Errorf("DLQ topic holds %d copies, want exactly 1", n)
	}
	if n := len(a.callsFor("t-1")); n != 1 {
		t.Errorf("app called %d times, want 1", n)
	}
	steps := timeline(t, cfg.Journal.Path, "test", "t-1")
	received := 0
	for _, st := range steps {
		if st.Kind == journal.Received {
			received++
		}
	}
	if received != 1 {
		t.Errorf("the record was consumed %d times, want once: %+v", received, steps)
	}
}
