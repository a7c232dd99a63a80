package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
)

const bodySize = 1024

// bodies returns a source of 1 KiB JSON message bodies with random content.
// Zeros, or one body repeated, compress to almost nothing on Kafka, and each
// fetch then decompresses to many times its size: memory figures would be
// the compressor's, not the consumer's.
func bodies(seed uint64) func(id string) []byte {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	raw := make([]byte, bodySize)
	return func(id string) []byte {
		for i := range raw {
			raw[i] = byte(rng.Uint32())
		}
		b := make([]byte, 0, bodySize)
		b = append(b, `{"id":"`...)
		b = append(b, id...)
		b = append(b, `","payload":"`...)
		b = base64.StdEncoding.AppendEncode(b, raw)
		b = b[:min(len(b), bodySize-2)]
		return append(b, `"}`...)
	}
}

// msgID is the id of message i: shaped like a random UUID, as most
// producers' ids are, so that consecutive messages are far apart in any
// index ordered by id (counted ids, "m-1", "m-2", …, would sit side by side
// and flatter such an index). The mix is a bijection: ids never repeat.
func msgID(i int) string {
	v, w := idBits(i)
	return fmt.Sprintf("%08x-%04x-4%03x-%04x-%012x", v>>32, v>>16&0xffff, v&0xfff, 0x8000|w>>48&0x3fff, w&0xffffffffffff)
}

// timeID is the id of message i made at now, shaped like a UUIDv7: the
// millisecond first, then random bits, so ids made later sort later, as with
// ULIDs or UUIDv7s.
func timeID(i int, now time.Time) string {
	v, w := idBits(i)
	ms := uint64(now.UnixMilli())
	return fmt.Sprintf("%08x-%04x-7%03x-%04x-%012x", ms>>16&0xffffffff, ms&0xffff, v&0xfff, 0x8000|w>>48&0x3fff, w&0xffffffffffff)
}

// idBits mixes i into two words; the mix is a bijection.
func idBits(i int) (v, w uint64) {
	v = uint64(i)*0x9e3779b97f4a7c15 ^ 0x6a09e667f3bcc909
	v ^= v >> 31
	v *= 0xbf58476d1ce4e5b9
	v ^= v >> 29
	return v, bits.RotateLeft64(v, 23) ^ 0x3c6ef372fe94f82b
}

// msgID is the id of message i in the run's id scheme.
func (o options) msgID(i int) string {
	if o.timeIDs {
		return timeID(i, time.Now())
	}
	return msgID(i)
}

// app is a running bench app process.
type app struct {
	cmd      *exec.Cmd
	url      string
	profiled bool // stopped with SIGTERM, so that it writes its profile
}

// startApp starts the bench app for run: with -profile, the app writes its
// own CPU profile too (run's name, .app.pprof), the other half of the work a
// message costs.
func startApp(o options, run string, mixed bool) (*app, error) {
	args := []string{"app"}
	if mixed {
		args = append(args, "-mixed")
	}
	cmd := exec.Command(o.self, args...)
	if o.profile != "" && run != "" {
		cmd.Env = append(os.Environ(), profileEnv+"="+filepath.Join(o.profile, o.profileName(strings.ReplaceAll(run, " ", ""))+".app.pprof"))
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("app did not start: %w", err)
	}
	addr := strings.TrimSpace(strings.TrimPrefix(line, "listening "))
	return &app{cmd: cmd, url: "http://" + addr + "/events", profiled: cmd.Env != nil}, nil
}

func (a *app) stop() {
	if a.profiled {
		// Given a few seconds to write its profile.
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		t := time.AfterFunc(5*time.Second, func() { _ = a.cmd.Process.Kill() })
		_ = a.cmd.Wait()
		t.Stop()
		return
	}
	_ = a.cmd.Process.Kill()
	_ = a.cmd.Wait()
}

func (a *app) stats() (appStats, error) {
	var st appStats
	resp, err := http.Get(strings.TrimSuffix(a.url, "/events") + "/stats")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// waitDone polls the app until every message ended (handled, or poison
// answered), or timeout.
// A consumer that exits (exited is closed) ends the wait at once.
func (a *app) waitDone(n int, timeout time.Duration, exited <-chan struct{}) (appStats, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := a.stats()
		if err == nil && st.Successes+st.Poison >= int64(n) {
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("%d of %d messages ended after %v", st.Successes+st.Poison, n, timeout)
		}
		select {
		case <-exited:
			return st, fmt.Errorf("consumer exited after %d of %d messages", st.Successes+st.Poison, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (st appStats) rate(n int) float64 {
	d := time.Duration(st.LastNano - st.FirstNano)
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// ceiling drives the app with a plain load loop: the loopback limit. With
// contract, each request carries the headers the sidecar's do (the
// CloudEvents attributes and Handoff-*, its User-Agent): what they cost
// the app is the floor they set under any consumer that speaks the
// contract.
func ceiling(o options, contract bool) (row, error) {
	name := "ceiling: load loop → app (no broker)"
	if contract {
		name = "ceiling, the sidecar's headers: load loop → app (no broker)"
	}
	r := row{name: name, calls: 1, noProcs: true}
	a, err := startApp(o, "", false)
	if err != nil {
		return r, err
	}
	const workers = 64
	client := appClient(workers)
	body := bodies(3)("c")
	var headers http.Header
	if contract {
		headers = http.Header{
			"User-Agent":          {"handoff"},
			"Ce-Specversion":      {"1.0"},
			"Ce-Source":           {"/kafka/bench-ceiling"},
			"Ce-Type":             {"handoff.message"},
			"Handoff-Attempt":     {"1"},
			"Handoff-Deadline":    {time.Now().Add(time.Hour).UTC().Format(broker.TimeLayout)},
			"Handoff-Redelivered": {"false"},
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(o.n); i = next.Add(1) {
				postWith(client, a.url, fmt.Sprint("c-", i), "", body, headers)
			}
		}()
	}
	wg.Wait()
	r.rate = float64(o.n) / time.Since(start).Seconds()
	a.stop()
	if ru, ok := a.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.appCPU = time.Duration(ru.Utime.Nano()+ru.Stime.Nano()).Seconds() / float64(o.n) * 10000
	}
	return r, nil
}

// consumer runs a consumer process until the app has seen every message end.
func consumer(name string, a *app, n int, cmd *exec.Cmd) (row, error) {
	r := row{name: name}
	p, err := startProc(cmd)
	if err != nil {
		return r, err
	}
	anon := sampleAnon(cmd.Process.Pid, p.done)
	st, waitErr := a.waitDone(n, 10*time.Minute, p.done)
	hwm, hwmErr := peakRSS(cmd.Process.Pid)
	r.anonMB = float64(anon()) / 1024
	p.stop()
	if waitErr != nil {
		return r, fmt.Errorf("%w; log tail: %s", waitErr, tail(p.logs.String()))
	}
	r.rate = st.rate(n)
	r.calls = float64(st.Calls) / float64(n)
	r.drain = time.Duration(st.LastNano - st.FirstNano)
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		r.cpu = cpu.Seconds() / float64(n) * 10000
	}
	if st.Batches > 0 {
		r.perBatch = float64(st.Calls) / float64(st.Batches)
	}
	if hwmErr == nil {
		r.rssMB = float64(hwm) / 1024
	} else {
		r.note = "no peak RSS: " + hwmErr.Error()
	}
	return r, nil
}

// rabbitQueue declares a fresh quorum queue and preloads n messages with a
// window of outstanding confirms.
func rabbitQueue(o options, name string) (string, func(), error) {
	conn, err := amqp.Dial(o.rabbit)
	if err != nil {
		return "", nil, fmt.Errorf("RabbitMQ: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return "", nil, err
	}
	q := fmt.Sprintf("bench.%s.%d", name, time.Now().UnixNano())
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		conn.Close()
		return "", nil, err
	}
	cleanup := func() {
		if c, err := conn.Channel(); err == nil {
			for _, name := range []string{q, q + ".retry", q + ".retry.1s", q + ".dlq"} {
				_, _ = c.QueueDelete(name, false, false, false)
			}
		}
		conn.Close()
	}
	if err := ch.Confirm(false); err != nil {
		cleanup()
		return "", nil, err
	}
	body := bodies(1)
	ctx := context.Background()
	var pending []*amqp.DeferredConfirmation
	flush := func() error {
		for _, dc := range pending {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				return errors.New("preload not confirmed")
			}
		}
		pending = pending[:0]
		return nil
	}
	for i := range o.n {
		id := o.msgID(i)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{
			MessageId: id, Body: body(id), DeliveryMode: amqp.Persistent,
		})
		if err != nil {
			cleanup()
			return "", nil, err
		}
		if pending = append(pending, dc); len(pending) == 256 {
			if err := flush(); err != nil {
				cleanup()
				return "", nil, err
			}
		}
	}
	if err := flush(); err != nil {
		cleanup()
		return "", nil, err
	}
	return q, cleanup, nil
}

func rabbitBaseline(o options) (row, error) {
	name := "RabbitMQ baseline (hand-written amqp091-go)"
	q, cleanup, err := rabbitQueue(o, "baseline")
	if err != nil {
		return row{name: name}, err
	}
	defer cleanup()
	return runConsumer(o, name, false, rabbitBaselineCmd(o, q, "RabbitMQ baseline"))
}

// starter builds the consumer process for an app, with what removes its
// files afterwards.
type starter func(a *app) (*exec.Cmd, func(), error)

func rabbitBaselineCmd(o options, q, run string) starter {
	return func(a *app) (*exec.Cmd, func(), error) {
		return baselineCmd(o, run, "baseline-rabbit", "-url", o.rabbit, "-queue", q, "-app", a.url), func() {}, nil
	}
}

func kafkaBaselineCmd(o options, topic, run string) starter {
	return func(a *app) (*exec.Cmd, func(), error) {
		return baselineCmd(o, run, "baseline-kafka", "-brokers", o.kafka, "-topic", topic, "-group", topic+"-g", "-app", a.url), func() {}, nil
	}
}

// kafkaShareBaselineCmd runs the hand-written share consumer; it polls as
// many records as the sidecar's default window (twice max_concurrency).
func kafkaShareBaselineCmd(o options, topic, run string) starter {
	return func(a *app) (*exec.Cmd, func(), error) {
		return baselineCmd(o, run, "baseline-kafka-share", "-brokers", o.kafka, "-topic", topic, "-group", topic+"-g", "-app", a.url,
			"-max-records", "128"), func() {}, nil
	}
}

// sidecarStarter runs the sidecar binary on one source; run names its
// profile.
func sidecarStarter(o options, run, source, sync string, batch bool) starter {
	return func(a *app) (*exec.Cmd, func(), error) {
		path, rm, err := sidecarConfig(a.url, source, sync, batch, o.metricsOff)
		if err != nil {
			return nil, nil, err
		}
		return sidecarCmd(o, path, strings.ReplaceAll(run, " ", "")), rm, nil
	}
}

func rabbitSource(o options, q string, prefetch int) string {
	return fmt.Sprintf("rabbitmq: {url: %q, queue: %q, prefetch: %d}", o.rabbit, q, prefetch)
}

func kafkaSource(o options, topic, ordering string) string {
	return fmt.Sprintf("kafka: {brokers: [%q], topic: %q, group: %q, ordering: %s}", o.kafka, topic, topic+"-g", ordering)
}

// batchSize is the batch-delivery column's max_messages; four batches may
// be in flight.
const batchSize = 64

// sidecarConfig writes the sidecar's config for one run. Its metrics are on
// (served on a port of its own, as a scraped sidecar's are) unless
// metricsOff.
func sidecarConfig(appURL, source, sync string, batch, metricsOff bool) (string, func(), error) {
	dir, err := os.MkdirTemp("", "handoff-bench-")
	if err != nil {
		return "", nil, err
	}
	handler := "max_concurrency: 64"
	if batch {
		handler = fmt.Sprintf("max_concurrency: %d, batch: {max_messages: %d, max_wait: 2ms}", 4*batchSize, batchSize)
	}
	listen := "127.0.0.1:0"
	if metricsOff {
		listen = ""
	}
	cfg := fmt.Sprintf(`handler: {url: %q, %s}
sources:
  - name: bench
    %s
retry: {tiers: [1s], base: 50ms, cap: 500ms}
journal: {path: %q, sync: %s}
telemetry: {metrics_listen: %q}
admin: {listen: "127.0.0.1:0"}
`, appURL, handler, source, filepath.Join(dir, "handoff.db"), sync, listen)
	path := filepath.Join(dir, "handoff.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return "", nil, err
	}
	return path, func() { _ = os.RemoveAll(dir) }, nil
}

func rabbitSidecar(o options, sync string, mixed, batch bool) (row, error) {
	name := o.metricsName(sidecarName("RabbitMQ sidecar, journal "+sync, mixed, batch))
	q, cleanup, err := rabbitQueue(o, "sidecar")
	if err != nil {
		return row{name: name}, err
	}
	defer cleanup()
	prefetch := 256
	if batch {
		prefetch = 8 * batchSize
	}
	return runConsumer(o, name, mixed, sidecarStarter(o, name, rabbitSource(o, q, prefetch), sync, batch))
}

// metricsName is a sidecar run's name, marked when its metrics are off.
func (o options) metricsName(name string) string {
	if o.metricsOff {
		return name + ", metrics off"
	}
	return name
}

func sidecarName(base string, mixed, batch bool) string {
	if batch {
		base += fmt.Sprintf(", batches of %d", batchSize)
	}
	if mixed {
		base += ", mixed failures"
	}
	return base
}

// runConsumer starts the app and the consumer process that build makes for
// it, until the app has seen every message end.
func runConsumer(o options, name string, mixed bool, build starter) (row, error) {
	a, err := startApp(o, name, mixed)
	if err != nil {
		return row{name: name}, err
	}
	defer a.stop()
	cmd, rm, err := build(a)
	if err != nil {
		return row{name: name}, err
	}
	defer rm()
	return consumer(name, a, o.n, cmd)
}

// baselineCmd runs a hand-written baseline, profiled when asked; run names
// its profile.
func baselineCmd(o options, run string, args ...string) *exec.Cmd {
	cmd := exec.Command(o.self, args...)
	if o.profile != "" {
		cmd.Env = append(os.Environ(), profileEnv+"="+filepath.Join(o.profile, o.profileName(strings.ReplaceAll(run, " ", ""))+".pprof"))
	}
	return cmd
}

// profileName is run's profile file name, with the comparison side it ran
// on, if any.
func (o options) profileName(run string) string {
	if o.side == "" {
		return run
	}
	return run + "." + o.side
}

// sidecarCmd runs the sidecar binary on path, profiled when asked.
func sidecarCmd(o options, path, run string) *exec.Cmd {
	args := []string{"run", "--config", path}
	if o.profile != "" {
		args = append(args, "--cpu-profile", filepath.Join(o.profile, o.profileName(run)+".pprof"))
	}
	if o.allocs {
		args = append(args, "--alloc-profile", filepath.Join(o.profile, o.profileName(run)+".allocs.pprof"))
	}
	return exec.Command(o.sidecar, args...)
}

// kafkaTopic creates a fresh 6-partition topic and preloads n records.
func kafkaTopic(o options, name string) (string, func(), error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.kafka), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return "", nil, err
	}
	adm := kadm.NewClient(cl)
	topic := fmt.Sprintf("bench-%s-%d", name, time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := adm.CreateTopic(ctx, 6, 1, nil, topic); err != nil {
		cl.Close()
		return "", nil, fmt.Errorf("Kafka: %w", err)
	}
	cleanup := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		topics := []string{topic}
		for _, g := range []string{topic + "-g"} {
			topics = append(topics, topic+"."+g+".retry.1s", topic+"."+g+".dlq", topic+"."+g+".dlq.ledger")
			// A share group's retry readers have a group of their own.
			_, _ = adm.DeleteGroups(ctx, g, g+".retries", g+".handoff-marks")
		}
		_, _ = adm.DeleteTopics(ctx, topics...)
		cl.Close()
	}
	body := bodies(2)
	var wg sync.WaitGroup
	var failed atomic.Value
	for i := range o.n {
		id := o.msgID(i)
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(id), Value: body(id), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}},
			func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Store(err)
				}
				wg.Done()
			})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("preload: %w", err)
	}
	return topic, cleanup, nil
}

func kafkaBaseline(o options) (row, error) {
	name := o.kafkaName + " baseline (hand-written franz-go)"
	topic, cleanup, err := kafkaTopic(o, "baseline")
	if err != nil {
		return row{name: name}, err
	}
	defer cleanup()
	return runConsumer(o, name, false, kafkaBaselineCmd(o, topic, o.kafkaName+" baseline"))
}

func kafkaShareBaseline(o options) (row, error) {
	name := o.kafkaName + " share group baseline (hand-written franz-go)"
	topic, cleanup, err := kafkaTopic(o, "sharebase")
	if err != nil {
		return row{name: name}, err
	}
	defer cleanup()
	return runConsumer(o, name, false, kafkaShareBaselineCmd(o, topic, o.kafkaName+" share baseline"))
}

func kafkaShareSidecar(o options) (row, error) {
	name := o.metricsName(o.kafkaName + " sidecar, share group, journal batch")
	topic, cleanup, err := kafkaTopic(o, "sharesidecar")
	if err != nil {
		return row{name: name}, err
	}
	defer cleanup()
	source := fmt.Sprintf("kafka: {brokers: [%q], topic: %q, share_group: %q}", o.kafka, topic, topic+"-g")
	return runConsumer(o, name, false, sidecarStarter(o, name, source, "batch", false))
}

func kafkaSidecar(o options, ordering string, mixed, batch bool) (row, error) {
	name := o.metricsName(sidecarName(o.kafkaName+" sidecar, ordering "+ordering+", journal batch", mixed, batch))
	topic, cleanup, err := kafkaTopic(o, "sidecar")
	if err != nil {
		return row{name: name}, err
	}
	defer cleanup()
	return runConsumer(o, name, mixed, sidecarStarter(o, name, kafkaSource(o, topic, ordering), "batch", batch))
}
