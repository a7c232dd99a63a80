package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// latencyRow is one paced run: messages published at a fixed rate into an
// empty queue while the consumer runs, latency measured publish → app.
type latencyRow struct {
	name     string
	rate     float64
	p50, p99 time.Duration
	note     string
	slow     []int64 // the slowest arrival of each second, ms
	// rounds lists a median row's rounds (latencyPairs); empty for a row
	// run once.
	rounds string
}

// pacedDuration is how long a latency run publishes.
const pacedDuration = 15 * time.Second

// pacedBroker is what a latency run needs of a broker: an empty queue or
// topic, a paced publisher, and how long a new consumer takes to settle in
// (a new Kafka group takes a few seconds to join).
type pacedBroker struct {
	create  func(o options, name string) (string, func(), error)
	publish func(o options, dest string, rate float64, d time.Duration) (int, error)
	settle  time.Duration
}

var (
	rabbitPaced = pacedBroker{create: rabbitQueue, publish: publishPaced, settle: time.Second}
	kafkaPaced  = pacedBroker{create: kafkaTopic, publish: producePaced, settle: 5 * time.Second}
)

// latency runs the consumer that start builds against an empty queue or
// topic while messages are published at rate, and reads the app's latencies.
// profile names the run's profiles.
func latency(o options, pb pacedBroker, name, profile string, rate float64, start func(dest string) starter) (latencyRow, error) {
	empty := o
	empty.n = 0
	dest, cleanup, err := pb.create(empty, "latency")
	if err != nil {
		return latencyRow{name: name, rate: rate}, err
	}
	defer cleanup()
	return paced(o, name, profile, rate, pb.settle, func() (int, error) { return pb.publish(o, dest, rate, pacedDuration) }, start(dest))
}

// paced starts an app and the consumer, lets the consumer settle in, runs
// publish, and reads the app's latencies once every message arrived.
func paced(o options, name, profile string, rate float64, settle time.Duration, publish func() (int, error), start starter) (latencyRow, error) {
	r := latencyRow{name: name, rate: rate}
	a, err := startApp(o, profile, false)
	if err != nil {
		return r, err
	}
	defer a.stop()
	cmd, rm, err := start(a)
	if err != nil {
		return r, err
	}
	defer rm()
	p, err := startProc(cmd)
	if err != nil {
		return r, err
	}
	defer p.stop()
	time.Sleep(settle) // connected and consuming
	n, err := publish()
	if err != nil {
		return r, err
	}
	st, err := a.waitDone(n, 2*time.Minute, p.done)
	if err != nil {
		p.stop()
		return r, fmt.Errorf("%w; log tail: %s", err, tail(p.logs.String()))
	}
	r.p50, r.p99 = time.Duration(st.P50Micros)*time.Microsecond, time.Duration(st.P99Micros)*time.Microsecond
	r.slow = st.SlowMillis
	return r, nil
}

// producePaced produces at rate for d, each record stamped with its produce
// time, and returns how many the broker acknowledged.
func producePaced(o options, topic string, rate float64, d time.Duration) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.kafka), kgo.ProducerLinger(0))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	body := bodies(5)
	var wg sync.WaitGroup
	var failed atomic.Value
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	ctx := context.Background()
	start := time.Now()
	n := 0
	for now := range t.C {
		if now.Sub(start) >= d {
			break
		}
		for want := int(now.Sub(start).Seconds() * rate); n < want; n++ {
			id := o.msgID(n)
			wg.Add(1)
			cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(id), Value: body(id), Headers: []kgo.RecordHeader{
				{Key: "ce_id", Value: []byte(id)},
				{Key: "x-sent", Value: []byte(strconv.FormatInt(time.Now().UnixNano(), 10))},
			}}, func(_ *kgo.Record, err error) {
				if err != nil {
					failed.Store(err)
				}
				wg.Done()
			})
		}
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return n, fmt.Errorf("produce: %w", err)
	}
	return n, nil
}

// kafkaLatencyRows is rabbitLatencyRows on Kafka.
func kafkaLatencyRows(o options, baseRate, sidecarRate float64) []latencyRow {
	return latencyPairs(o, kafkaPaced, "Kafka baseline (hand-written franz-go)", "Kafka sidecar, ordering none, journal batch",
		baseRate, sidecarRate, func(topic string) string { return kafkaSource(o, topic, "none") }, func(topic, run string) starter { return kafkaBaselineCmd(o, topic, run) })
}

// publishPaced publishes at rate for d, each message stamped with its
// publish time, and returns how many the broker confirmed.
func publishPaced(o options, q string, rate float64, d time.Duration) (int, error) {
	conn, err := amqp.Dial(o.rabbit)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	// Confirmed, or the last publishes before the close can be lost and the
	// run would wait for messages that never existed.
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	var confirmed, nacked atomic.Int64
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
	go func() {
		for c := range confirms {
			if c.Ack {
				confirmed.Add(1)
			} else {
				nacked.Add(1)
			}
		}
	}()
	body := bodies(4)
	const tick = 10 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	n := 0
	for now := range t.C {
		if now.Sub(start) >= d {
			break
		}
		for want := int(now.Sub(start).Seconds() * rate); n < want; n++ {
			id := o.msgID(n)
			err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
				MessageId: id, Body: body(id), DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{"x-sent": strconv.FormatInt(time.Now().UnixNano(), 10)},
			})
			if err != nil {
				return n, err
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for confirmed.Load()+nacked.Load() < int64(n) {
		if time.Now().After(deadline) {
			return n, fmt.Errorf("%d of %d publishes confirmed after 30s", confirmed.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if k := nacked.Load(); k > 0 {
		return n, fmt.Errorf("the broker refused %d of %d publishes", k, n)
	}
	return n, nil
}

// rabbitLatencyRows runs the baseline and the sidecar in pairs at the same
// load: a third of the baseline's drain rate, then a quarter of the
// sidecar's, which both sustain while a publisher shares the cores.
func rabbitLatencyRows(o options, baseRate, sidecarRate float64) []latencyRow {
	return latencyPairs(o, rabbitPaced, "RabbitMQ baseline (hand-written amqp091-go)", "RabbitMQ sidecar, journal batch",
		baseRate, sidecarRate, func(q string) string { return rabbitSource(o, q, 256) }, func(q, run string) starter { return rabbitBaselineCmd(o, q, run) })
}

// latencyPairs runs a baseline row and a sidecar row at a third of the
// baseline's drain rate (the publisher shares the cores: at half, the
// baseline's own tail is seconds here), in turn o.rounds times, each shown
// as its median round (paired.go); then once each at a quarter of the
// sidecar's. source is the sidecar's source for a queue or topic, baseline
// the baseline for it (run names its profile). Each run writes a profile of
// its own.
func latencyPairs(o options, pb pacedBroker, baseName, sidecarName string, baseRate, sidecarRate float64,
	source func(dest string) string, baseline func(dest, run string) starter) []latencyRow {
	pace := "third"
	run := func(o options, name string, rate float64, sidecar bool) latencyRow {
		profile := name + ", paced " + pace
		r, err := latency(o, pb, name, profile, rate, func(dest string) starter {
			if sidecar {
				return sidecarStarter(o, profile, source(dest), "batch", false)
			}
			return baseline(dest, profile)
		})
		if err != nil {
			r.note = "failed: " + err.Error()
		}
		return r
	}
	show := func(r latencyRow) {
		fmt.Printf("%-44s paced %6.0f msg/s  p50 %8v  p99 %8v  %s\n", r.name, r.rate, r.p50, r.p99, r.shownNote())
	}
	var rows []latencyRow
	third := func(name string, sidecar bool) func(options) latencyRow {
		return func(o options) latencyRow { return run(o, name, baseRate/3, sidecar) }
	}
	rounds := inTurn(o, []func(options) latencyRow{
		third(baseName+", a third of its drain rate", false),
		third(sidecarName+", same load", true),
	}, func(r latencyRow, round int) {
		r.name += fmt.Sprintf(" [round %d]", round)
		show(r)
	})
	for _, rs := range rounds {
		r := medianLatency(rs)
		show(r)
		rows = append(rows, r)
	}
	if sidecarRate > 0 {
		pace = "quarter"
		for _, r := range []latencyRow{
			run(o, baseName+", a quarter of the sidecar's drain rate", sidecarRate/4, false),
			run(o, sidecarName+", same load", sidecarRate/4, true),
		} {
			show(r)
			rows = append(rows, r)
		}
	}
	return rows
}

// shownNote is a paced row's note column: its note and its rounds.
func (r latencyRow) shownNote() string {
	if r.note == "" || r.rounds == "" {
		return r.note + r.rounds
	}
	return r.note + "; " + r.rounds
}

// medianLatency is a paced row's median round: its p50 and p99 each the
// median of the rounds that did not fail, the rounds' p99 in its note.
func medianLatency(rounds []latencyRow) latencyRow {
	var ok []latencyRow
	failed := 0
	for _, r := range rounds {
		if r.note == "" {
			ok = append(ok, r)
		} else {
			failed++
		}
	}
	if len(ok) == 0 || len(rounds) == 1 {
		return rounds[0]
	}
	m := ok[0]
	m.p50 = time.Duration(medianOf(ok, func(r latencyRow) float64 { return float64(r.p50) })).Round(time.Microsecond)
	m.p99 = time.Duration(medianOf(ok, func(r latencyRow) float64 { return float64(r.p99) })).Round(time.Microsecond)
	p99s := make([]string, len(ok))
	for i, r := range ok {
		p99s[i] = r.p99.Round(100 * time.Microsecond).String()
	}
	m.rounds = fmt.Sprintf("median of %d rounds (p99 %s)", len(ok), strings.Join(p99s, ", "))
	if failed > 0 {
		m.rounds += fmt.Sprintf("; %d of %d rounds failed", failed, len(rounds))
	}
	return m
}

// pacedRounds runs the paced rows alone at o.paced, o.rounds times: the
// baseline, then the sidecar (and, with -compare, the other sidecar), on
// each broker o.only leaves in.
func pacedRounds(o options) error {
	type broker struct {
		pb                    pacedBroker
		baseName, sidecarName string
		source                func(dest string) string
		baseline              func(dest, run string) starter
	}
	var brokers []broker
	if o.only != "kafka" {
		brokers = append(brokers, broker{rabbitPaced, "RabbitMQ baseline", "RabbitMQ sidecar",
			func(q string) string { return rabbitSource(o, q, 256) },
			func(q, run string) starter { return rabbitBaselineCmd(o, q, run) }})
	}
	if o.only != "rabbitmq" {
		brokers = append(brokers, broker{kafkaPaced, "Kafka baseline", "Kafka sidecar",
			func(topic string) string { return kafkaSource(o, topic, "none") },
			func(topic, run string) starter { return kafkaBaselineCmd(o, topic, run) }})
	}
	sidecars := []string{o.sidecar}
	if o.compare != "" {
		other, err := filepath.Abs(o.compare)
		if err != nil {
			return err
		}
		sidecars = append(sidecars, other)
	}
	show := func(r latencyRow, err error) {
		if err != nil {
			r.note = "failed: " + err.Error()
		}
		fmt.Printf("%-52s paced %6.0f msg/s  p50 %8v  p99 %8v  %s\n", r.name, r.rate, r.p50, r.p99, r.note)
		fmt.Printf("    slowest each second, ms: %v\n", r.slow)
	}
	for round := 1; round <= o.rounds; round++ {
		for _, b := range brokers {
			name := fmt.Sprintf("%s [round %d]", b.baseName, round)
			show(latency(o, b.pb, name, name, o.paced, func(dest string) starter { return b.baseline(dest, name) }))
			for _, bin := range sidecars {
				so := o
				so.sidecar = bin
				so.allocs = so.allocs && bin == o.sidecar // an earlier build may not know the flag
				name := fmt.Sprintf("%s %s [round %d]", b.sidecarName, filepath.Base(bin), round)
				show(latency(so, b.pb, name, name, o.paced, func(dest string) starter {
					return sidecarStarter(so, name, b.source(dest), "batch", false)
				}))
			}
		}
	}
	return nil
}
