package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// latencyRow is one paced run: messages published at a fixed rate into an
// empty queue while the consumer runs, latency measured publish → app.
type latencyRow struct {
	name     string
	rate     float64
	p50, p99 time.Duration
	note     string
}

// pacedDuration is how long a latency run publishes.
const pacedDuration = 15 * time.Second

// rabbitLatency runs the consumer that start builds against an empty queue
// while messages are published at rate, and reads the app's latencies.
func rabbitLatency(o options, name string, rate float64, start func(a *app, q string) (*exec.Cmd, func(), error)) (latencyRow, error) {
	r := latencyRow{name: name, rate: rate}
	saved := o.n
	o.n = 0
	q, cleanup, err := rabbitQueue(o, "latency")
	o.n = saved
	if err != nil {
		return r, err
	}
	defer cleanup()
	a, err := startApp(o.self, false)
	if err != nil {
		return r, err
	}
	defer a.stop()
	cmd, rm, err := start(a, q)
	if err != nil {
		return r, err
	}
	defer rm()
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return r, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
	}()
	time.Sleep(time.Second) // connected and consuming
	n, err := publishPaced(o, q, rate, pacedDuration)
	if err != nil {
		return r, err
	}
	st, err := a.waitDone(n, 2*time.Minute, done)
	if err != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
		return r, fmt.Errorf("%w; log tail: %s", err, tail(logs.String()))
	}
	r.p50, r.p99 = time.Duration(st.P50Micros)*time.Microsecond, time.Duration(st.P99Micros)*time.Microsecond
	return r, nil
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
			err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
				MessageId: fmt.Sprint("l-", n), Body: body(fmt.Sprint("l-", n)), DeliveryMode: amqp.Persistent,
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

// rabbitLatencyRows runs the baseline and the sidecar at half the baseline's
// drain rate (the same load), and the sidecar at half its own.
func rabbitLatencyRows(o options, baseRate, sidecarRate float64) []latencyRow {
	rate := baseRate / 2
	var rows []latencyRow
	add := func(r latencyRow, err error) {
		if err != nil {
			r.note = "failed: " + err.Error()
		}
		fmt.Printf("%-44s paced %6.0f msg/s  p50 %8v  p99 %8v  %s\n", r.name, r.rate, r.p50, r.p99, r.note)
		rows = append(rows, r)
	}
	add(rabbitLatency(o, "RabbitMQ baseline (hand-written amqp091-go)", rate, func(a *app, q string) (*exec.Cmd, func(), error) {
		return exec.Command(o.self, "baseline-rabbit", "-url", o.rabbit, "-queue", q, "-app", a.url), func() {}, nil
	}))
	sidecar := func(a *app, q string) (*exec.Cmd, func(), error) {
		path, rm, err := sidecarConfig(a.url, fmt.Sprintf("rabbitmq: {url: %q, queue: %q, prefetch: 256}", o.rabbit, q), "batch", false)
		if err != nil {
			return nil, nil, err
		}
		return exec.Command(o.sidecar, "run", "--config", path), rm, nil
	}
	add(rabbitLatency(o, "RabbitMQ sidecar, journal batch", rate, sidecar))
	if sidecarRate > 0 {
		// Its drain rate was measured on a preloaded queue; with a publisher
		// on the same cores it saturates sooner, hence a quarter as well.
		add(rabbitLatency(o, "RabbitMQ sidecar, journal batch, at half its own rate", sidecarRate/2, sidecar))
		add(rabbitLatency(o, "RabbitMQ sidecar, journal batch, at a quarter of its own rate", sidecarRate/4, sidecar))
	}
	return rows
}
