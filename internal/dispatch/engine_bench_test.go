package dispatch

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/telemetry"
)

// BenchmarkEngine is what one message costs the whole process on the path
// every healthy message takes — taken, journaled, handed to an app that
// answers success at once, acked — with the sidecar's defaults: its retry
// policy, budget and concurrency, its metrics (on, as with metrics_listen
// set), tracing off. The source is in memory and yields a delivery as soon
// as the broker's window (prefetch, Kafka's max in flight) has room, so the
// engine is the only thing that holds it back.
//
// cpu-ns/op is the CPU time of the whole process (every goroutine, the
// journal's writer and the GC included) over the timed part, per message:
// on a loaded machine it is steadier than ns/op, which is wall time.
// The harness variant is the source and the acks alone, without the engine:
// what the figures of the others include that is not the sidecar's (its
// two allocations a message, the delivery and its id, among them).
func BenchmarkEngine(b *testing.B) {
	for _, kind := range []benchKind{benchRabbitMQ, benchKafka} {
		for _, j := range []string{"bbolt", "noop"} {
			b.Run(kind.name+"/journal="+j, func(b *testing.B) { benchEngine(b, kind, j, 1) })
		}
	}
	// Batches of 64, as handoff-bench's batch rows: four in flight, and
	// one more in Kafka's window.
	b.Run("kafka/batch=64/journal=bbolt", func(b *testing.B) { benchEngine(b, benchKafka, "bbolt", 64) })
	b.Run("harness", func(b *testing.B) {
		src := newBenchSource(benchRabbitMQ, b.N)
		measure(b, src, func(ctx context.Context) {
			_ = src.Consume(ctx, func(d broker.Delivery) { _ = d.Ack() })
		})
	})
}

// benchKind is the shape of a broker's deliveries.
type benchKind struct {
	name string
	// window is how many deliveries may be unsettled at once: RabbitMQ's
	// prefetch, the Kafka consumer's max in flight (their defaults).
	window int
	// kafka: deliveries have a log position (and so no message id), a
	// hand-out fence already durable, as a poll's marks mostly are, and
	// leave the window once answered, as the Kafka client's do, held to as
	// many answered as the client holds (benchSource.held).
	kafka bool
}

var (
	benchRabbitMQ = benchKind{name: "rabbitmq", window: 64}
	benchKafka    = benchKind{name: "kafka", window: 128, kafka: true}
)

func benchEngine(b *testing.B, kind benchKind, journalKind string, batch int) {
	def := config.Default()
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	metrics, err := telemetry.NewMetrics(telemetry.MetricsOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var jr Journal = noopJournal{}
	var bj *journal.Journal
	var commits atomic.Int64
	if journalKind == "bbolt" {
		j, _, err := journal.Open(filepath.Join(b.TempDir(), "journal.db"), journal.Options{
			Sync:   journal.SyncBatch,
			Linger: def.Journal.Linger.D(),
			Logger: discard,
			OnCommit: func(took time.Duration) {
				commits.Add(1)
				metrics.Committed(took)
			},
		})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = j.Close() }()
		jr, bj = j, j
	}
	r := def.Retry
	tiers := make([]time.Duration, len(r.Tiers))
	for i, t := range r.Tiers {
		tiers[i] = t.D()
	}
	var app Deliverer = benchApp{}
	concurrency := def.Handler.MaxConcurrency
	if batch > 1 {
		bt := handler.NewBatcher(benchApp{}, handler.BatchOptions{MaxMessages: batch, MaxWait: 2 * time.Millisecond})
		defer bt.Close()
		app, concurrency = bt, 4*batch
		if kind.kafka {
			// max_in_flight's default with batches.
			kind.window = concurrency + batch
		}
	}
	src := newBenchSource(kind, b.N)
	e := New(Options{
		Routes: []Route{{Name: "bench", System: kind.name, Destination: "bench", Sources: []Source{src},
			Transfer: benchTransfer{}, CESource: "bench"}},
		Handler: app,
		Policy: &budget.Policy{MaxAttempts: r.MaxAttempts, Base: r.Base.D(), Cap: r.Cap.D(), Tiers: tiers,
			Deadline: r.Deadline.D(), DeferMaxAge: r.DeferMaxAge.D(), MinAttempt: r.MinAttempt.D(), Jitter: rand.Float64},
		Journal:         jr,
		Budget:          budget.NewRetryBudget(def.Budget.Ratio, def.Budget.MinPerSecond, def.Budget.Window.D(), nil),
		Timeout:         def.Handler.Timeout.D(),
		MaxConcurrency:  concurrency,
		MaxMessageBytes: int(def.Handler.MaxMessageBytes),
		DrainTimeout:    time.Second,
		Logger:          discard,
		Observer:        metrics,
	})
	measure(b, src, func(ctx context.Context) {
		if err := e.Run(ctx); err != nil {
			b.Error(err)
		}
	})
	if n := src.released.Load(); n > 0 {
		b.Fatalf("%d deliveries handed back: every one should be handled and acked", n)
	}
	if journalKind == "bbolt" {
		// A group commit's fsyncs are most of the journal's cost: how
		// many messages share one says how well the writer groups them.
		b.ReportMetric(float64(b.N)/float64(max(commits.Load(), 1)), "msgs/commit")
		// What the journal keeps a message: the parts a hand-off's records
		// were written in, their keys and links.
		if st, err := bj.Stats(); err == nil {
			b.ReportMetric(float64(st.InUse)/float64(b.N), "bytes/msg")
		}
	}
}

// measure runs run until src's deliveries are all acked, timing that and
// reporting it per message.
func measure(b *testing.B, src *benchSource, run func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, start := cpuTime(b), time.Now()
	go func() { defer close(ran); run(ctx) }()
	select {
	case <-src.done:
	case <-ran:
	}
	took, cpu := time.Since(start), cpuTime(b)-cpu0
	b.StopTimer()
	cancel()
	<-ran
	if n := src.acked.Load(); n != int64(b.N) {
		b.Fatalf("%d of %d deliveries acked", n, b.N)
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(b.N)/took.Seconds(), "msgs/s")
}

// cpuTime is the user and system CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchSource yields n deliveries, each as soon as fewer than its window are
// unsettled.
type benchSource struct {
	kind   benchKind
	n      int
	window chan struct{} // a token for each unsettled delivery
	// held bounds a Kafka-like source's deliveries handed out and not
	// settled, the answered ones out of the window included, as the Kafka
	// client's does (16 windows, at least 4,096): without it a commit that
	// lags lets the source run ahead of it without bound.
	held     chan struct{}
	lost     chan struct{} // never closed
	fenced   chan struct{} // closed: every hand-out is durable
	acked    atomic.Int64
	released atomic.Int64
	done     chan struct{} // closed once all n are acked
}

func newBenchSource(kind benchKind, n int) *benchSource {
	s := &benchSource{kind: kind, n: n, window: make(chan struct{}, kind.window), lost: make(chan struct{}),
		fenced: make(chan struct{}), done: make(chan struct{})}
	close(s.fenced)
	if kind.kafka {
		s.held = make(chan struct{}, max(16*kind.window, 4096))
	}
	return s
}

// benchHeaders are every message's application headers: read, never
// written, so they are shared.
var benchHeaders = broker.Headers{"x-tenant": "acme", "content-type": "application/json"}

// benchBody is a small JSON event, as most are.
var benchBody = []byte(`{"order_id":"o-1842","customer":"c-77","items":[{"sku":"A-1","qty":2},{"sku":"B-9","qty":1}],"total":"42.50"}`)

func (s *benchSource) Consume(ctx context.Context, deliver func(broker.Delivery)) error {
	for i := range s.n {
		if s.held != nil {
			select {
			case s.held <- struct{}{}:
			case <-ctx.Done():
				return nil
			}
		}
		select {
		case s.window <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		msg := broker.Message{Body: benchBody, ContentType: "application/json", Headers: benchHeaders}
		if s.kind.kafka {
			// One allocation for the delivery, as for RabbitMQ's.
			d := &fencedBenchDelivery{benchDelivery: benchDelivery{s: s, msg: msg}}
			d.msg.Position = "kafka:bench/0/" + strconv.Itoa(i)
			d.msg.Origin = d.msg.Position
			deliver(d)
			continue
		}
		d := &benchDelivery{s: s, msg: msg}
		d.msg.MessageID = "m-" + strconv.Itoa(i)
		d.msg.Origin = "rabbitmq:bench"
		deliver(d)
	}
	<-ctx.Done()
	return nil
}

type benchDelivery struct {
	s   *benchSource
	msg broker.Message
}

func (d *benchDelivery) Message() *broker.Message { return &d.msg }
func (d *benchDelivery) Lost() <-chan struct{}    { return d.s.lost }

func (d *benchDelivery) Ack() error {
	<-d.s.window
	d.acked()
	return nil
}

func (d *benchDelivery) acked() {
	if d.s.acked.Add(1) == int64(d.s.n) {
		close(d.s.done)
	}
}

func (d *benchDelivery) Release() error {
	<-d.s.window
	d.s.released.Add(1)
	return nil
}

// fencedBenchDelivery is a Kafka delivery: its hand-out has a fence, and,
// as the Kafka client's, it leaves the window once the app has answered
// (broker.Answered), while its outcome is committed.
type fencedBenchDelivery struct {
	benchDelivery
	out atomic.Bool // out of the window: answered, acked or released
}

func (d *fencedBenchDelivery) Durable() <-chan struct{} { return d.s.fenced }

func (d *fencedBenchDelivery) Answered() { d.leave() }

func (d *fencedBenchDelivery) Ack() error {
	d.leave()
	<-d.s.held
	d.acked()
	return nil
}

func (d *fencedBenchDelivery) Release() error {
	d.leave()
	<-d.s.held
	d.s.released.Add(1)
	return nil
}

func (d *fencedBenchDelivery) leave() {
	if d.out.CompareAndSwap(false, true) {
		<-d.s.window
	}
}

// benchApp answers success at once.
type benchApp struct{}

func (benchApp) Deliver(context.Context, *handler.Request) handler.Result {
	return handler.Result{Outcome: budget.Success, Status: 200}
}
func (benchApp) Probe(context.Context) error { return nil }

// SendBatch answers every event success, event by event.
func (benchApp) SendBatch(_ context.Context, reqs []*handler.Request) ([]handler.Result, handler.Result, bool) {
	each := make([]handler.Result, len(reqs))
	for i := range each {
		each[i] = handler.Result{Outcome: budget.Success, Status: 200}
	}
	return each, handler.Result{}, false
}

// benchTransfer takes every copy; on the success path there are none.
type benchTransfer struct{}

func (benchTransfer) Transfer(context.Context, broker.Destination, *broker.Message, broker.Headers) error {
	return nil
}

// noopJournal keeps nothing: the engine's own share of a message's cost,
// without the journal's.
type noopJournal struct{}

func (noopJournal) State(journal.Key) (journal.State, error)                     { return journal.State{}, nil }
func (noopJournal) Append(context.Context, journal.Key, ...journal.Record) error { return nil }
func (noopJournal) AppendAsync(journal.Key, ...journal.Record)                   {}
func (noopJournal) Probe(context.Context) error                                  { return nil }
