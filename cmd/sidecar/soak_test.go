//go:build soak

package main

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/testkit"
)

// TestSoak is `make soak`: steady load on both brokers at once for
// HANDOFF_SOAK (10m unless set) with 5% transient failures and 0.5% poison
// messages, a SIGKILL of the sidecar every minute, and on RabbitMQ its
// connections force-closed every 20 s between the kills. Afterwards every
// message is accounted for (lost = 0, the poison and only it dead-lettered),
// and RSS, goroutines and the journal's file size, sampled every 10 s, stay
// flat after warm-up. The series are printed. It is not part of make test.
func TestSoak(t *testing.T) {
	d := 10 * time.Minute
	if v := os.Getenv("HANDOFF_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("HANDOFF_SOAK: %v", err)
		}
	}
	t.Run("rabbitmq", func(t *testing.T) {
		t.Parallel()
		// A vhost of its own: closing its connections touches nothing else.
		url := testVhost(t)
		vhost := url[strings.LastIndexByte(url, '/')+1:]
		var cmu sync.Mutex
		conn := dialRabbitURL(t, url)
		q := testQueue(t, conn, []time.Duration{time.Second})
		soak(t, d, soakTarget{
			source: fmt.Sprintf("rabbitmq: {url: %q, queue: %q, prefetch: 16}", url, q),
			publish: func(ids []string) {
				var msgs []publishing
				for _, id := range ids {
					msgs = append(msgs, publishing{MessageId: id, Body: []byte(id)})
				}
				cmu.Lock()
				defer cmu.Unlock()
				publish(t, conn, q, msgs...)
			},
			deadLetters: func() []string {
				cmu.Lock()
				defer cmu.Unlock()
				var out []string
				for _, m := range readStream(t, conn, rabbitmq.DeadLetterQueue(q)) {
					id, _ := m.Headers[broker.HeaderEventID].(string)
					out = append(out, id)
				}
				return out
			},
			chaos: func() {
				cmu.Lock()
				defer cmu.Unlock()
				_ = conn.Close() // the publisher's goes too; reopened after
				rabbitmqctl(t, "close_all_connections", "-p", vhost, "soak: connections force-closed")
				conn = dialRabbitURL(t, url)
			},
		})
	})
	t.Run("kafka", func(t *testing.T) {
		t.Parallel()
		brokers, topic := brokertest.KafkaTopic(t, "soak", 3)
		soak(t, d, soakTarget{
			source: fmt.Sprintf("kafka: {brokers: [%q], topic: %q, group: %q, session_timeout: 6s}",
				strings.Join(brokers, ","), topic, kafkaGroup(topic)),
			publish: func(ids []string) {
				var recs []*kgo.Record
				for _, id := range ids {
					recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}})
				}
				produceKafka(t, brokers, recs...)
			},
			deadLetters: func() []string {
				var out []string
				for _, r := range readTopic(t, brokers, kafka.DeadLetterTopic(topic, kafkaGroup(topic))) {
					out = append(out, header(r, broker.HeaderEventID))
				}
				return out
			},
		})
	})
}

type soakTarget struct {
	source      string
	publish     func(ids []string)
	deadLetters func() []string
	// chaos, when set, breaks the broker side between kills.
	chaos func()
}

// soakKind is what the app does with id: 0.5% poison (422), 5% transient
// (500 on the first attempt), the rest succeed. By hash, so it is the same
// on every call.
func soakKind(id string) string {
	h := fnv.New32a()
	_, _ = io.WriteString(h, id)
	switch v := h.Sum32() % 1000; {
	case v < 5:
		return "poison"
	case v < 55:
		return "transient"
	}
	return "ok"
}

type soakSample struct {
	at               time.Duration
	rssMB            float64
	goroutines       int
	journalMB        float64
	handled, arrived int
}

func soak(t *testing.T, d time.Duration, target soakTarget) {
	bin := sidecarBinary(t)
	var mu sync.Mutex
	succeeded := map[string]bool{}
	again, unflagged := 0, 0 // calls after a success, and those not flagged redelivered
	// An app that keeps no record of its calls but the ids it handled: the
	// test apps' call log, scanned on every call, would be what slows down
	// over ten minutes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id := r.Header.Get("Ce-Id")
		mu.Lock()
		defer mu.Unlock()
		if succeeded[id] {
			again++
			if r.Header.Get("Handoff-Redelivered") != "true" {
				unflagged++
			}
		}
		switch soakKind(id) {
		case "poison":
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		case "transient":
			if r.Header.Get("Handoff-Attempt") == "1" {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
		}
		succeeded[id] = true
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = app.Serve(ln) }()
	t.Cleanup(func() { _ = app.Close() })
	appURL := "http://" + ln.Addr().String() + "/events"
	dir := t.TempDir()
	jpath := filepath.Join(dir, "handoff.db")
	cfg := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 16}
sources:
  - name: soak
    %s
retry: {max_attempts: 10, tiers: [1s], base: 50ms, cap: 500ms}
telemetry: {metrics_listen: "127.0.0.1:0"}
journal: {path: %q, max_size: 8MiB}
`, appURL, target.source, jpath))

	// The sidecar, restarted after each kill; its health address changes.
	var cur *runningBinary
	var curMu sync.Mutex
	start := func() {
		r := startBinary(t, bin, cfg)
		curMu.Lock()
		cur = r
		curMu.Unlock()
	}
	start()

	// The load: 50 messages a second, in batches of 5.
	var ids []string
	var idsMu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		n := 0
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			batch := make([]string, 5)
			for i := range batch {
				batch[i] = fmt.Sprintf("s-%d", n)
				n++
			}
			target.publish(batch)
			idsMu.Lock()
			ids = append(ids, batch...)
			idsMu.Unlock()
		}
	}()

	began := time.Now()
	var series []soakSample
	sample := func() {
		curMu.Lock()
		r := cur
		curMu.Unlock()
		s := soakSample{at: time.Since(began).Round(time.Second)}
		s.rssMB = procRSS(r.cmd.Process.Pid)
		s.goroutines = scrapeGauge(r.health, "handoff_goroutines")
		if fi, err := os.Stat(jpath); err == nil {
			s.journalMB = float64(fi.Size()) / (1 << 20)
		}
		mu.Lock()
		s.handled = len(succeeded)
		mu.Unlock()
		idsMu.Lock()
		s.arrived = len(ids)
		idsMu.Unlock()
		series = append(series, s)
	}
	kills, chaos := 0, 0
	every := time.NewTicker(10 * time.Second)
	for time.Since(began) < d {
		<-every.C
		sample()
		switch elapsed := time.Since(began); {
		case int(elapsed/time.Minute) > kills:
			kills++
			curMu.Lock()
			r := cur
			curMu.Unlock()
			_ = r.cmd.Process.Signal(syscall.SIGKILL)
			_ = r.cmd.Wait()
			start()
		case target.chaos != nil && int(elapsed/(20*time.Second)) > chaos+kills:
			chaos++
			target.chaos()
		}
	}
	every.Stop()
	close(stop)
	wg.Wait()

	total := len(ids)
	testkit.Eventually(t, 5*time.Minute, "every message handled or dead-lettered", func() bool {
		mu.Lock()
		handled := len(succeeded)
		mu.Unlock()
		poison := 0
		for _, id := range ids {
			if soakKind(id) == "poison" {
				poison++
			}
		}
		return handled == total-poison && len(target.deadLetters()) >= poison
	})
	curMu.Lock()
	cur.stop(t)
	curMu.Unlock()

	dead := map[string]int{}
	for _, id := range target.deadLetters() {
		dead[id]++
	}
	lost, wrongDLQ, dupDLQ := 0, 0, 0
	mu.Lock()
	for _, id := range ids {
		if !succeeded[id] && dead[id] == 0 {
			lost++
		}
		if soakKind(id) != "poison" && dead[id] > 0 {
			wrongDLQ++
		}
		if dead[id] > 1 {
			dupDLQ += dead[id] - 1
		}
	}
	repeats, repeatsUnflagged := again, unflagged
	mu.Unlock()

	var b strings.Builder
	fmt.Fprintf(&b, "%8s %8s %10s %10s %8s %8s\n", "at", "RSS MB", "goroutines", "journal MB", "handled", "arrived")
	for _, s := range series {
		fmt.Fprintf(&b, "%8v %8.1f %10d %10.1f %8d %8d\n", s.at, s.rssMB, s.goroutines, s.journalMB, s.handled, s.arrived)
	}
	t.Logf("%v, %d messages, %d SIGKILLs, %d connection kills: lost=%d, dead-lettered=%d (poison), good ones dead-lettered=%d, duplicate DLQ copies=%d, app calls after a success=%d (not flagged redelivered: %d)\n%s",
		d, total, kills, chaos, lost, len(dead), wrongDLQ, dupDLQ, repeats, repeatsUnflagged, b.String())
	if repeatsUnflagged != 0 {
		t.Errorf("%d calls after a success did not say Handoff-Redelivered: true", repeatsUnflagged)
	}
	if lost != 0 || wrongDLQ != 0 || dupDLQ != 0 {
		t.Errorf("lost %d, good ones dead-lettered %d, duplicate DLQ copies %d: want 0 each", lost, wrongDLQ, dupDLQ)
	}
	// Flat after warm-up: the last third's peak within 1.5× the middle
	// third's (RSS, goroutines) and the journal at its bound (8 MiB of live
	// data, a file of at most 8 MiB plus bbolt's 16 MiB growth step, twice).
	if len(series) >= 6 {
		third := len(series) / 3
		mid, last := series[third:2*third], series[2*third:]
		peak := func(ss []soakSample, f func(soakSample) float64) float64 {
			var m float64
			for _, s := range ss {
				m = max(m, f(s))
			}
			return m
		}
		for _, g := range []struct {
			name string
			f    func(soakSample) float64
		}{
			{"RSS", func(s soakSample) float64 { return s.rssMB }},
			{"goroutines", func(s soakSample) float64 { return float64(s.goroutines) }},
		} {
			if m, l := peak(mid, g.f), peak(last, g.f); m > 0 && l > 1.5*m {
				t.Errorf("%s grew after warm-up: peak %.1f in the middle third, %.1f in the last", g.name, m, l)
			}
		}
		if j := peak(series, func(s soakSample) float64 { return s.journalMB }); j > 8+2*16 {
			t.Errorf("journal file reached %.1f MB under an 8 MiB bound", j)
		}
	}
}

// procRSS is a process's resident set, in MB; 0 when it cannot be read.
func procRSS(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return float64(kb) / 1024
		}
	}
	return 0
}

var gaugeLine = regexp.MustCompile(`(?m)^(\w+)(?:\{[^}]*\})? ([0-9.e+]+)$`)

// scrapeGauge reads one unlabelled gauge from a sidecar's /metrics; -1
// when it cannot.
func scrapeGauge(health, name string) int {
	resp, err := http.Get("http://" + health + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, m := range gaugeLine.FindAllStringSubmatch(string(body), -1) {
		if m[1] == name {
			v, _ := strconv.ParseFloat(m[2], 64)
			return int(v)
		}
	}
	return -1
}
