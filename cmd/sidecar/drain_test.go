package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// The drain run's shape: an app that handles mu a second, a backlog of
// preload waiting when the sidecar starts, then arrivals at lambda (slower
// than the app), then at lambdaFast with the app down to muSlow. lambda is
// well below mu: on a loaded machine the sidecar, not the app, sets the
// pace (60/s has been seen), and the estimate B/(μ−λ) is only as steady as
// μ−λ is large next to μ's jitter between the two sides' windows. The window is short so
// that the run is, and long enough that Kafka's commits, every 250ms, blur
// the rates by a few percent only.
const (
	drainMu         = 200
	drainLambda     = 20
	drainLambdaFast = 400
	drainMuSlow     = 10
	drainPreload    = 4000
	drainWindow     = 5 * time.Second
)

// TestDrainTimeFollowsTheBacklog is seed 000's arithmetic on a live run: the
// sidecar's handoff_backlog_drain_seconds is B/(μ−λ) of its exported parts,
// which follow the run's own counts (what the producer sent, what the app
// handled): the backlog closely, the rates within a factor of two; and it
// is +Inf once arrivals outpace the app.
func TestDrainTimeFollowsTheBacklog(t *testing.T) {
	t.Parallel()
	t.Run("rabbitmq", func(t *testing.T) {
		t.Parallel()
		conn := dialRabbit(t)
		q := testQueue(t, conn, []time.Duration{time.Second})
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ch.Close() })
		send := func(ctx context.Context, id string) error {
			return ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{MessageId: id, Body: []byte(id)})
		}
		var preload []publishing
		for i := range drainPreload {
			preload = append(preload, publishing{MessageId: fmt.Sprintf("pre-%d", i), Body: []byte("x")})
		}
		publish(t, conn, q, preload...)
		drainRun(t, len(preload), send, func(appURL string) config.Config {
			cfg := testConfig(appURL, q, time.Second)
			cfg.Handler.Timeout = config.Duration(10 * time.Second)
			return cfg
		})
	})
	t.Run("kafka", func(t *testing.T) {
		t.Parallel()
		brokers, topic := realKafkaTopic(t, "drain", 2)
		var preload []*kgo.Record
		for i := range drainPreload {
			id := fmt.Sprintf("pre-%d", i)
			preload = append(preload, &kgo.Record{Topic: topic, Value: []byte("x"), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}})
		}
		produceKafka(t, brokers, preload...)
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		// Not waiting on each write, or the producer could not keep pace.
		send := func(ctx context.Context, id string) error {
			cl.Produce(ctx, &kgo.Record{Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}},
				func(_ *kgo.Record, err error) {
					if err != nil && ctx.Err() == nil {
						t.Errorf("produce: %v", err)
					}
				})
			return nil
		}
		drainRun(t, len(preload), send, func(appURL string) config.Config {
			cfg := kafkaConfig(appURL, brokers, topic, time.Second)
			cfg.Handler.Timeout = config.Duration(10 * time.Second)
			return cfg
		})
	})
}

// drainPoint is the run's own count at one moment.
type drainPoint struct {
	at                time.Time
	produced, handled int64
}

// drainRun runs the drain scenario on a source holding preload messages:
// send publishes one more, build makes the sidecar's config for the app.
func drainRun(t *testing.T, preload int, send func(context.Context, string) error, build func(appURL string) config.Config) {
	t.Helper()
	var handled atomic.Int64
	appLimit := rate.NewLimiter(drainMu, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if appLimit.Wait(r.Context()) != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		handled.Add(1)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	ctx, stop := context.WithCancel(context.Background())
	var produced atomic.Int64
	produced.Store(int64(preload))
	arrivals := rate.NewLimiter(drainLambda, 1)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(stop)
	wg.Go(func() {
		for i := 0; arrivals.Wait(ctx) == nil; i++ {
			if err := send(ctx, fmt.Sprintf("new-%d", i)); err != nil {
				if ctx.Err() == nil {
					t.Errorf("publish: %v", err)
				}
				return
			}
			produced.Add(1)
		}
	})
	// The run's own counts, ten times a second.
	var pmu sync.Mutex
	var points []drainPoint
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			pmu.Lock()
			points = append(points, drainPoint{time.Now(), produced.Load(), handled.Load()})
			pmu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	// own is B/(μ−λ) from the run's counts over the last window, and its
	// parts.
	own := func() (drain, b, lambda, mu float64) {
		p, h := produced.Load(), handled.Load()
		now := time.Now()
		then := func() drainPoint {
			pmu.Lock()
			defer pmu.Unlock()
			i := sort.Search(len(points), func(i int) bool { return points[i].at.After(now.Add(-drainWindow)) })
			return points[max(i-1, 0)]
		}()
		dt := now.Sub(then.at).Seconds()
		lambda, mu = float64(p-then.produced)/dt, float64(h-then.handled)/dt
		b = float64(p - h)
		if mu <= lambda {
			return math.Inf(1), b, lambda, mu
		}
		return b / (mu - lambda), b, lambda, mu
	}

	cfg := build("http://" + ln.Addr().String() + "/events")
	cfg.Telemetry.DrainWindow = config.Duration(drainWindow)
	started := time.Now()
	s := startSidecar(t, cfg)
	gauge := func(name string) float64 {
		return sample(scrape(t, s.health), name, map[string]string{"source": "test"})
	}

	// Arrivals slower than the app: once two whole windows have passed, so
	// that neither side's window still holds the start (the sidecar
	// connecting, its first calls), the estimate matches the run's own
	// arithmetic.
	testkit.Eventually(t, 40*time.Second, "two whole windows of readings", func() bool {
		return time.Since(started) > 2*drainWindow+time.Second && gauge("handoff_backlog_drain_seconds") >= 0
	})
	// The gauge is the sidecar's own arithmetic on its exported parts, and
	// those parts follow the run: the backlog closely (both count what was
	// produced and not yet handled), λ and μ within a factor of two. Both
	// rates are over a window, but the sidecar's is sampled every twelfth
	// of it while the run's ends now: when the app's pace moves (a loaded
	// machine), their drain times, B/(μ−λ) with μ−λ of twenty or so, drift
	// apart by half and more, and a tighter bound on them tests the
	// machine, not the sidecar.
	fams := scrape(t, s.health)
	want, b, lambda, mu := own()
	at := func(name string) float64 { return sample(fams, name, map[string]string{"source": "test"}) }
	got, gb, gl, gm := at("handoff_backlog_drain_seconds"), at("handoff_backlog_messages"), at("handoff_arrival_rate"), at("handoff_completion_rate")
	t.Logf("drain %.1fs (B %.0f, λ %.0f/s, μ %.0f/s); the run's own: %.1fs (B %.0f, λ %.0f/s, μ %.0f/s)", got, gb, gl, gm, want, b, lambda, mu)
	if math.IsInf(want, 1) || want <= 0 {
		t.Fatalf("the run itself is not draining (λ %.0f/s, μ %.0f/s): the app or the producer is off its pace", lambda, mu)
	}
	if gm <= gl || math.Abs(got/(gb/(gm-gl))-1) > 0.01 {
		t.Errorf("drain %.1fs is not B/(μ−λ) of the sidecar's own B %.0f, λ %.1f, μ %.1f", got, gb, gl, gm)
	}
	if math.Abs(gb-b) > 0.05*b+10 {
		t.Errorf("backlog %.0f, the run's %.0f", gb, b)
	}
	for _, r := range []struct {
		name      string
		got, want float64
	}{{"λ", gl, lambda}, {"μ", gm, mu}} {
		if r.got < r.want/2 || r.got > 2*r.want {
			t.Errorf("%s %.1f/s, the run's %.1f/s: not within a factor of two", r.name, r.got, r.want)
		}
	}

	// Arrivals faster than the app: the backlog never drains. The app slows
	// down too, so that the gap holds on a machine too busy for the
	// producer to reach its pace.
	arrivals.SetLimit(drainLambdaFast)
	appLimit.SetLimit(drainMuSlow)
	testkit.Eventually(t, 4*drainWindow, "the drain time to say +Inf", func() bool {
		return math.IsInf(gauge("handoff_backlog_drain_seconds"), 1)
	})
	if _, b, lambda, mu := own(); mu >= lambda {
		t.Errorf("+Inf while the run's own counts say it drains: B %.0f, λ %.0f/s, μ %.0f/s", b, lambda, mu)
	}
}
