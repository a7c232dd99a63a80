package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/config"
)

// BenchmarkJournalSyncModes drains a preloaded RabbitMQ queue through the
// whole sidecar with each journal.sync mode, in alternating rounds so that
// machine noise hits every mode alike, and reports each mode's median rate
// and the ratio of batch to none. Run it with -benchtime=1x (make bench).
func BenchmarkJournalSyncModes(b *testing.B) {
	const (
		n      = 20000
		rounds = 3
	)
	modes := []string{"baseline", "none", "batch", "always"}
	if m := os.Getenv("BENCH_SYNC_MODES"); m != "" {
		modes = strings.Split(m, ",")
	}
	rates := map[string][]float64{}
	for range b.N {
		for r := range rounds {
			for _, mode := range modes {
				var rate float64
				if mode == "baseline" {
					rate = baselineRate(b, n)
				} else {
					rate = drainRate(b, mode, n)
				}
				rates[mode] = append(rates[mode], rate)
				b.Logf("round %d %-6s %8.0f msgs/s", r+1, mode, rate)
			}
		}
	}
	med := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for _, mode := range modes {
		b.ReportMetric(med(rates[mode]), mode+"-msgs/s")
	}
	if len(rates["batch"]) > 0 && len(rates["none"]) > 0 {
		b.ReportMetric(med(rates["batch"])/med(rates["none"]), "batch/none")
	}
	if len(rates["batch"]) > 0 && len(rates["baseline"]) > 0 {
		b.ReportMetric(med(rates["batch"])/med(rates["baseline"]), "batch/baseline")
	}
}

// drainRate preloads n 1 KiB messages, then times the sidecar handing all of
// them to a loopback app that answers 200 at once.
func drainRate(b *testing.B, mode string, n int) float64 {
	b.Helper()
	conn, err := amqp.Dial(rabbitURL())
	if err != nil {
		b.Fatalf("RabbitMQ is required: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q := fmt.Sprintf("bench.sync.%s.%d", mode, time.Now().UnixNano())
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, name := range []string{q, q + ".retry", q + ".dlq", q + ".retry.1s"} {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
		ch.Close()
	}()
	preload(b, ch, q, n)

	var calls atomic.Int64
	all := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if calls.Add(1) == int64(n) {
			close(all)
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	cfg := config.Default()
	cfg.Handler.URL = "http://" + ln.Addr().String() + "/events"
	cfg.Handler.MaxConcurrency = 64
	declare := true
	cfg.Sources = []config.Source{{Name: "bench", RabbitMQ: &config.RabbitMQ{URL: rabbitURL(), Queue: q, Prefetch: 256, Declare: &declare}}}
	cfg.Retry.Tiers = []config.Duration{config.Duration(time.Second)}
	cfg.Journal.Path = filepath.Join(b.TempDir(), "handoff.db")
	cfg.Journal.Sync = mode
	cfg.Telemetry.MetricsListen = ""
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- serve(ctx, cfg, discardLogger(), hooks{}) }()
	select {
	case <-all:
	case err := <-done:
		b.Fatalf("sidecar stopped: %v", err)
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d messages after 5 minutes", calls.Load(), n)
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return float64(n) / elapsed.Seconds()
}

// baselineRate is the same drain by the consumer a team would write without
// the sidecar: prefetch, a worker pool posting to the app over pooled
// keep-alive connections, ack on 2xx.
func baselineRate(b *testing.B, n int) float64 {
	b.Helper()
	conn, err := amqp.Dial(rabbitURL())
	if err != nil {
		b.Fatalf("RabbitMQ is required: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q := fmt.Sprintf("bench.baseline.%d", time.Now().UnixNano())
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		b.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(q, false, false, false); ch.Close() }()
	preload(b, ch, q, n)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) })}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/events"
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}}

	cch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	if err := cch.Qos(256, 0, false); err != nil {
		b.Fatal(err)
	}
	deliveries, err := cch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	var acked atomic.Int64
	all := make(chan struct{})
	start := time.Now()
	for range 64 {
		go func() {
			for d := range deliveries {
				resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(d.Body))
				if err != nil || resp.StatusCode/100 != 2 {
					_ = d.Nack(false, true)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				_ = d.Ack(false)
				if acked.Add(1) == int64(n) {
					close(all)
				}
			}
		}()
	}
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		b.Fatalf("baseline: only %d of %d after 5 minutes", acked.Load(), n)
	}
	return float64(n) / time.Since(start).Seconds()
}

// preload publishes n 1 KiB messages with a window of outstanding confirms.
func preload(b *testing.B, ch *amqp.Channel, q string, n int) {
	b.Helper()
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 1024)
	ctx := context.Background()
	const window = 256
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	flush := func() {
		for _, dc := range pending {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				b.Fatalf("preload not confirmed: %v", err)
			}
		}
		pending = pending[:0]
	}
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("b-%d", i), Body: body, DeliveryMode: amqp.Persistent,
		})
		if err != nil {
			b.Fatal(err)
		}
		pending = append(pending, dc)
		if len(pending) == window {
			flush()
		}
	}
	flush()
}
