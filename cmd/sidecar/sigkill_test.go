package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/testkit"
)

// The SIGKILL tests kill the real binary several times during a mixed
// workload (successes, transient failures, poison messages), restart it on
// the same journal, and account for every message: none lost, poison ones
// (and only they) dead-lettered; they report how often the app was called
// again after it had already succeeded, and how many DLQ copies were written
// twice.
//
// A kill that lands between the broker taking a DLQ copy and the journal
// recording its confirm (a few milliseconds) leaves the restart unsure whether
// the copy exists; it looks (Kafka reads the DLQ topic back, RabbitMQ the DLQ
// stream) instead of writing a second one, so there are no duplicates.

const killTier = 300 * time.Millisecond

// killTarget is the broker side of a SIGKILL test.
type killTarget struct {
	// source is the YAML of the source's broker block.
	source string
	// handler is more of the handler block's YAML, after its url and
	// max_concurrency: ", batch: {…}" to deliver in batches.
	handler string
	// inFlight is how many deliveries the source hands out unsettled at
	// most: what one kill can leave to be called again.
	inFlight int
	// publish sends one message per id, the id as its event id and body.
	publish func(ids []string)
	// idle reports whether the source and its retry path hold nothing.
	idle func() bool
	// deadCount is how many DLQ copies there are, without taking them.
	deadCount func() int
	// deadLetters returns every DLQ copy: its event id and a signature of
	// its hop, attempt and reason. It may take them off the DLQ.
	deadLetters func() [][2]string
}

func TestSIGKILLMixedWorkloadRabbitMQ(t *testing.T) {
	t.Parallel()
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{killTier})
	runSIGKILLWorkload(t, killTarget{
		source: fmt.Sprintf("rabbitmq: {url: %q, queue: %q, prefetch: 8}", brokertest.RabbitURL(), q),
		// A prefetch of 8 on the queue and 8 on its retry queue.
		inFlight: 16,
		publish: func(ids []string) {
			var msgs []publishing
			for _, id := range ids {
				msgs = append(msgs, publishing{MessageId: id, Body: []byte(id)})
			}
			publish(t, conn, q, msgs...)
		},
		idle: func() bool {
			for _, name := range []string{q, rabbitmq.RetryQueue(q), rabbitmq.TierQueue(q, killTier)} {
				if depth(t, conn, name) != 0 {
					return false
				}
			}
			return true
		},
		deadCount: func() int { return len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))) },
		deadLetters: func() [][2]string {
			var out [][2]string
			for _, d := range readStream(t, conn, rabbitmq.DeadLetterQueue(q)) {
				id, _ := d.Headers[broker.HeaderEventID].(string)
				out = append(out, [2]string{id, fmt.Sprint(d.Headers[broker.HeaderHops], "/", d.Headers[broker.HeaderAttempt], "/", d.Headers[broker.HeaderDeadReason])})
			}
			return out
		},
	})
}

func TestSIGKILLMixedWorkloadKafka(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"plain", "transactional", "share group", "batches"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testSIGKILLKafka(t, mode)
		})
	}
}

func testSIGKILLKafka(t *testing.T, mode string) {
	brokers, topic := realKafkaTopic(t, "kill", 3)
	// Static membership by default, on the journal's id: each restart
	// takes the partitions back at once (and, transactional, aborts the
	// transaction the kill left open). A share group's member has none:
	// the records a killed member held go back to the group as its
	// connection closes, and each restart takes what is next.
	source := fmt.Sprintf("kafka: {brokers: [%q], topic: %q, group: %q, session_timeout: 6s, transactional_transfer: %v}",
		strings.Join(brokers, ","), topic, kafkaGroup(topic), mode == "transactional")
	if mode == "share group" {
		source = fmt.Sprintf("kafka: {brokers: [%q], topic: %q, share_group: %q}", strings.Join(brokers, ","), topic, kafkaGroup(topic))
	}
	var batch string
	if mode == "batches" {
		// Eight to a request: a walk's answer goes on without a goroutine
		// waiting on its call, and a kill lands with batches in flight.
		batch = ", batch: {max_messages: 8, max_wait: 5ms}"
	}
	runSIGKILLWorkload(t, killTarget{
		source:  source,
		handler: batch,
		// max_in_flight's default: four times max_concurrency (8), or
		// twice with ordering none (a share group's: one poll; with
		// batches, max_concurrency and one batch more).
		inFlight: 32,
		publish: func(ids []string) {
			var recs []*kgo.Record
			for i, id := range ids {
				recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(i % 30)), Value: []byte(id),
					Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}})
			}
			produceKafka(t, brokers, recs...)
		},
		idle: func() bool { return true }, // the counts decide; offsets are checked after
		deadCount: func() int {
			return len(readTopic(t, brokers, kafka.DeadLetterTopic(topic, kafkaGroup(topic))))
		},
		deadLetters: func() [][2]string {
			var out [][2]string
			for _, r := range readTopic(t, brokers, kafka.DeadLetterTopic(topic, kafkaGroup(topic))) {
				out = append(out, [2]string{header(r, broker.HeaderEventID),
					header(r, broker.HeaderHops) + "/" + header(r, broker.HeaderAttempt) + "/" + header(r, broker.HeaderDeadReason)})
			}
			return out
		},
	})
	if mode == "share group" {
		checkShareGroupDone(t, brokers, topic, kafkaGroup(topic), 3)
		return
	}
	checkCommittedAtLogEnd(t, brokers, topic)
}

// checkShareGroupDone checks that the share group has nothing of topic
// left: every record acknowledged, none left for the brokers to deliver or
// archive.
func checkShareGroupDone(t *testing.T, brokers []string, topic, group string, partitions int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var left []string
	testkit.Wait(30*time.Second, func() bool {
		left = left[:0]
		described, err := kadm.NewClient(cl).DescribeShareGroupOffsets(context.Background(), group)
		if err != nil {
			left = append(left, err.Error())
			return false
		}
		g := described[group]
		if g.Err != nil {
			left = append(left, fmt.Sprintf("the group: %v", g.Err))
		}
		seen := 0
		g.Offsets.Each(func(o kadm.ShareOffset) {
			if o.Topic != topic {
				return
			}
			seen++
			if o.Err != nil || o.Lag != 0 {
				left = append(left, fmt.Sprintf("%s[%d]: lag %d (%v)", o.Topic, o.Partition, o.Lag, o.Err))
			}
		})
		if seen != partitions {
			left = append(left, fmt.Sprintf("offsets of %d of the topic's %d partitions", seen, partitions))
		}
		return len(left) == 0
	})
	for _, l := range left {
		t.Errorf("share group %s has records left: %s", group, l)
	}
}

// callerGone reports whether c's caller closes its connection within a
// second: a killed sidecar's is closed by its kernel, a live one's stays
// open while it waits for the answer. mu, held by the caller, is let go
// meanwhile.
func callerGone(c call, mu *sync.Mutex) bool {
	if c.Gone == nil {
		return false
	}
	mu.Unlock()
	defer mu.Lock()
	return testkit.Wait(time.Second, c.Gone)
}

func runSIGKILLWorkload(t *testing.T, target killTarget) {
	bin := sidecarBinary(t)
	kind := func(id string) string { return id[:strings.IndexByte(id, '-')] }
	var mu sync.Mutex
	succeeded := map[string]int{}          // calls answered 200, per id
	firstSuccess := map[string]time.Time{} // when the first 200 was answered
	afterSuccess := map[string]int{}       // calls after the first 200
	unflagged := 0                         // of those, calls not saying Handoff-Redelivered: true
	sentBefore := 0                        // of those, calls whose request reached the app before the 200
	a := newApp(t, func(w http.ResponseWriter, c call, prior []call) {
		time.Sleep(15 * time.Millisecond)
		id := c.Header.Get("Ce-Id")
		mu.Lock()
		defer mu.Unlock()
		if succeeded[id] > 0 {
			afterSuccess[id]++
			// A request that reached the app before the success was
			// answered was sent before it, by a sidecar since killed: a
			// batch's events are taken up one after another, and the
			// next sidecar's call of a message in it may be taken up
			// first. Its flag says what was known when it was sent.
			switch {
			case !c.Arrived.After(firstSuccess[id]):
				sentBefore++
			case c.Header.Get("Handoff-Redelivered") != "true" && c.Accepted.Before(firstSuccess[id]) && callerGone(c, &mu):
				// Arrived is read by the app's goroutine, which a loaded
				// machine can hold up for longer than a restart takes: a
				// request on a connection older than the success, whose
				// sidecar has been killed since, may have been written
				// before it.
				sentBefore++
			case c.Header.Get("Handoff-Redelivered") != "true":
				unflagged++
				// What the app saw of this event, for the failure's report.
				var seen []string
				for _, p := range prior {
					seen = append(seen, fmt.Sprintf("attempt %s redelivered %q at %+dms", p.Header.Get("Handoff-Attempt"),
						p.Header.Get("Handoff-Redelivered"), p.Arrived.Sub(firstSuccess[id]).Milliseconds()))
				}
				t.Logf("unflagged call after a success: %s attempt %s, %dms after the first success; before it: %s",
					id, c.Header.Get("Handoff-Attempt"), c.Arrived.Sub(firstSuccess[id]).Milliseconds(), strings.Join(seen, "; "))
			}
		}
		switch {
		case kind(id) == "poison":
			w.WriteHeader(http.StatusUnprocessableEntity)
		case kind(id) == "flaky" && len(prior) == 0:
			w.WriteHeader(http.StatusInternalServerError)
		default:
			if succeeded[id] == 0 {
				firstSuccess[id] = time.Now()
			}
			succeeded[id]++
			w.WriteHeader(http.StatusOK)
		}
	})
	// An attempt cut off by a kill counts as a failed (unknown) one; with
	// several kills landing on the same redelivered messages a small
	// max_attempts would dead-letter a good message, which is the budget
	// working, not what this test is about.
	cfgPath := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 8%s}
sources:
  - name: kill
    %s
retry: {max_attempts: 10, tiers: [%s], base: 50ms, cap: 200ms}
telemetry: {metrics_listen: ""}
admin: {listen: "127.0.0.1:0"}
journal: {path: %q}
`, a.url(), target.handler, target.source, killTier, filepath.Join(t.TempDir(), "handoff.db")))

	ids := mixedWorkload(600)
	target.publish(ids)

	var logs bytes.Buffer
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "--config", cfgPath)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	const kills = 5
	for k := range kills {
		cmd := start()
		time.Sleep(time.Duration(250+rand.IntN(250)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		t.Logf("kill %d: %d app calls so far", k+1, len(a.allCalls()))
	}
	final := start()
	t.Cleanup(func() {
		_ = final.Process.Signal(syscall.SIGTERM)
		_ = final.Wait()
	})

	done := func() bool {
		if !target.idle() {
			return false
		}
		mu.Lock()
		handled := len(succeeded)
		mu.Unlock()
		return handled+target.deadCount() >= len(ids)
	}
	deadline := time.Now().Add(90 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			// A goroutine dump says where it stands; the log is read once
			// the process has exited and stopped writing it.
			_ = final.Process.Signal(syscall.SIGQUIT)
			_ = final.Wait()
			path := filepath.Join(os.TempDir(), fmt.Sprintf("handoff-%s.log", strings.ReplaceAll(t.Name(), "/", "-")))
			_ = os.WriteFile(path, logs.Bytes(), 0o644)
			t.Fatalf("workload not finished after the last restart; whole log with a goroutine dump in %s", path)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // let anything still in flight land
	if err := final.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := final.Wait(); err != nil {
		t.Errorf("final sidecar exited with %v after SIGTERM", err)
	}

	dead := map[string]int{}
	first := map[string]string{} // id → the copy's hop/attempt/reason
	for _, d := range target.deadLetters() {
		id, sig := d[0], d[1]
		dead[id]++
		if kind(id) != "poison" {
			t.Logf("good message %s dead-lettered: hops/attempt/reason %s", id, sig)
		}
		if prev, ok := first[id]; ok && prev != sig {
			t.Errorf("two different DLQ copies of %s: %s and %s", id, prev, sig)
		}
		first[id] = sig
	}
	mu.Lock()
	defer mu.Unlock()
	lost, dupDLQ, wrongDLQ, missingDLQ, callsAfter := 0, 0, 0, 0, 0
	for _, id := range ids {
		if succeeded[id] == 0 && dead[id] == 0 {
			lost++
			t.Errorf("lost: %s", id)
		}
		if dead[id] > 1 {
			dupDLQ += dead[id] - 1
		}
		if kind(id) == "poison" && dead[id] == 0 {
			missingDLQ++
		}
		if kind(id) != "poison" && dead[id] > 0 {
			wrongDLQ++
		}
		callsAfter += afterSuccess[id]
	}
	t.Logf("%d messages, %d SIGKILLs, %d app calls: lost=%d duplicate DLQ copies=%d app calls after success=%d (on %d messages, %d sent before it, %d not flagged redelivered)",
		len(ids), kills, len(a.allCalls()), lost, dupDLQ, callsAfter, len(afterSuccess), sentBefore, unflagged)
	if unflagged != 0 {
		t.Errorf("%d calls after a success did not say Handoff-Redelivered: true", unflagged)
	}
	// A kill can leave to be called again only deliveries handed out and
	// not yet settled: calls in flight, and answered ones whose outcome the
	// journal had not yet made durable.
	if callsAfter > kills*target.inFlight {
		t.Errorf("%d calls after success: more than the %d deliveries that %d kills could have left in flight", callsAfter, kills*target.inFlight, kills)
	}
	if lost != 0 {
		t.Errorf("%d messages lost", lost)
	}
	if dupDLQ != 0 {
		t.Errorf("%d duplicate DLQ copies although an unconfirmed copy is looked for before it is written again", dupDLQ)
	}
	if missingDLQ != 0 || wrongDLQ != 0 {
		t.Errorf("%d poison messages missing from the DLQ, %d good ones in it", missingDLQ, wrongDLQ)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// mixedWorkload names n messages of a kill test by what the app does with
// them: one in ten poison (422), three in ten flaky (500 once), the rest ok.
func mixedWorkload(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		switch {
		case i%10 == 0:
			ids[i] = fmt.Sprintf("poison-%d", i)
		case i%10 < 4:
			ids[i] = fmt.Sprintf("flaky-%d", i)
		default:
			ids[i] = fmt.Sprintf("ok-%d", i)
		}
	}
	return ids
}
