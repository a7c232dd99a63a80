package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/sidecar"
	"handoff.dev/handoff/internal/testkit"
)

// dialRabbit connects to the test broker. Broker tests skip under -short and
// otherwise fail, never skip, when it is missing: make brokers starts it.
func dialRabbit(t *testing.T) *amqp.Connection {
	t.Helper()
	return dialRabbitURL(t, brokertest.RabbitURL())
}

func dialRabbitURL(t *testing.T, url string) *amqp.Connection {
	t.Helper()
	brokertest.SkipShort(t, "RabbitMQ")
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("RabbitMQ at %s is required (scripts/rabbitmq-local start): %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// testQueue declares a fresh quorum source queue with a unique name and
// deletes it and every derived queue when the test ends.
func testQueue(t *testing.T, conn *amqp.Connection, tiers []time.Duration) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "test." + strings.ReplaceAll(strings.ToLower(t.Name()), "/", ".") + "." + hex.EncodeToString(b[:])
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := amqp.Dial(brokertest.RabbitURL())
		if err != nil {
			return
		}
		defer c.Close()
		ch, err := c.Channel()
		if err != nil {
			return
		}
		names := []string{name, rabbitmq.RetryQueue(name), rabbitmq.DeadLetterQueue(name), rabbitmq.LedgerQueue(name)}
		for _, tier := range tiers {
			names = append(names, rabbitmq.TierQueue(name, tier))
		}
		for _, q := range names {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	return name
}

type publishing = amqp.Publishing

func publish(t *testing.T, conn *amqp.Connection, queue string, msgs ...publishing) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var dcs []*amqp.DeferredConfirmation
	for _, m := range msgs {
		m.DeliveryMode = amqp.Persistent
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, m)
		if err != nil {
			t.Fatal(err)
		}
		dcs = append(dcs, dc)
	}
	for _, dc := range dcs {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

// readStream is every message of a stream (a dead-letter queue), read from
// its first to its end; reading takes nothing away.
//
// A read ends when the stream stays quiet for a moment (rabbitmq.ReadStream),
// so a broker that stalls longer than that on a loaded machine ends it
// early. A stream only grows: a read that returns fewer messages than an
// earlier read of the same stream saw is such a short read, and is made
// again.
func readStream(t *testing.T, conn *amqp.Connection, stream string) []amqp.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen, _ := streamSeen.Load(stream)
	for {
		var out []amqp.Delivery
		if err := rabbitmq.ReadStream(ctx, conn, stream, "first", func(d *amqp.Delivery) bool {
			out = append(out, *d)
			return true
		}); err != nil {
			t.Fatalf("read %s: %v", stream, err)
		}
		if before, _ := seen.(int); len(out) >= before {
			for {
				cur, loaded := streamSeen.LoadOrStore(stream, len(out))
				if !loaded || cur.(int) >= len(out) || streamSeen.CompareAndSwap(stream, cur, len(out)) {
					break
				}
			}
			return out
		}
		select {
		case <-ctx.Done():
			t.Fatalf("read %s: %d messages, fewer than the %v an earlier read saw", stream, len(out), seen)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// streamSeen is, by stream, the most messages a read of it returned.
var streamSeen sync.Map

// depth is the number of ready messages in queue.
func depth(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect %s: %v", queue, err)
	}
	return q.Messages
}

// call is one request the app received.
type call struct {
	// At is when the app took the call up; Arrived when its request
	// reached the app: a batch's events are taken up one after another.
	At, Arrived time.Time
	// Accepted is when the app accepted the connection the request came
	// on; Gone reports whether its caller has closed that connection since
	// (a killed sidecar's has), so the answer reaches nobody.
	Accepted time.Time
	Gone     func() bool
	Header   http.Header
	Body     []byte
}

// acceptedKey is the context key of a connection's accept time.
type acceptedKey struct{}

// app is a scripted HTTP app on loopback. respond picks the answer for each
// call; it sees the calls so far for the same ce-id.
type app struct {
	t       *testing.T
	mu      sync.Mutex
	calls   []call
	batches []int // events per batch request
	respond func(w http.ResponseWriter, c call, prior []call)
	srv     *http.Server
	ln      net.Listener
	addr    string
}

func newApp(t *testing.T, respond func(w http.ResponseWriter, c call, prior []call)) *app {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &app{t: t, respond: respond, addr: ln.Addr().String()}
	a.serve(ln)
	t.Cleanup(a.stop)
	return a
}

func (a *app) serve(ln net.Listener) {
	a.ln = ln
	a.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		arrived := time.Now()
		// With the body read, the server watches the connection: a caller
		// that closes it cancels the request's context.
		from := call{Gone: func() bool { return r.Context().Err() != nil }}
		from.Accepted, _ = r.Context().Value(acceptedKey{}).(time.Time)
		if r.Header.Get("Content-Type") == handler.BatchContentType {
			a.batch(w, body, arrived, from)
			return
		}
		from.At, from.Arrived, from.Header, from.Body = arrived, arrived, r.Header.Clone(), body
		a.one(w, from)
	}), ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, acceptedKey{}, time.Now())
	}}
	go func() { _ = a.srv.Serve(ln) }()
}

// one records c and answers it.
func (a *app) one(w http.ResponseWriter, c call) {
	a.mu.Lock()
	var prior []call
	for _, p := range a.calls {
		if p.Header.Get("Ce-Id") == c.Header.Get("Ce-Id") {
			prior = append(prior, p)
		}
	}
	a.calls = append(a.calls, c)
	a.mu.Unlock()
	if a.respond != nil {
		a.respond(w, c, prior)
	}
}

// batch answers a batch by running the same script on each event as a call
// of its own (its attributes as the headers binary mode would have sent),
// and returns one result per event: its status, Retry-After and
// Handoff-Outcome.
func (a *app) batch(w http.ResponseWriter, body []byte, arrived time.Time, from call) {
	var events []map[string]any
	if err := json.Unmarshal(body, &events); err != nil {
		a.t.Errorf("app: batch body: %v", err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.batches = append(a.batches, len(events))
	a.mu.Unlock()
	var results []map[string]any
	for _, e := range events {
		h := http.Header{}
		for k, v := range e {
			s, ok := v.(string)
			if !ok {
				continue
			}
			switch {
			case strings.HasPrefix(k, "handoff"):
				h.Set("Handoff-"+strings.TrimPrefix(k, "handoff"), s)
			case k != "data_base64":
				h.Set("Ce-"+k, s)
			}
		}
		var data []byte
		if v, ok := e["data_base64"].(string); ok {
			data, _ = base64.StdEncoding.DecodeString(v)
		} else if v, ok := e["data"]; ok {
			data, _ = json.Marshal(v)
		}
		rec := httptest.NewRecorder()
		a.one(rec, call{At: time.Now(), Arrived: arrived, Accepted: from.Accepted, Gone: from.Gone, Header: h, Body: data})
		res := map[string]any{"id": e["id"], "status": rec.Code, "detail": rec.Body.String()}
		if v := rec.Header().Get("Retry-After"); v != "" {
			res["retry_after"] = v
		}
		if v := rec.Header().Get("Handoff-Outcome"); v != "" {
			res["outcome"] = v
		}
		results = append(results, res)
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
}

func (a *app) stop() {
	if a.srv != nil {
		_ = a.srv.Close()
	}
}

func (a *app) url() string { return "http://" + a.addr + "/events" }

// callsFor returns the calls made for one event id.
func (a *app) callsFor(id string) []call {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []call
	for _, c := range a.calls {
		if c.Header.Get("Ce-Id") == id {
			out = append(out, c)
		}
	}
	return out
}

// largestBatch is the most events one batch request carried.
func (a *app) largestBatch() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, b := range a.batches {
		n = max(n, b)
	}
	return n
}

func (a *app) allCalls() []call {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]call(nil), a.calls...)
}

// contractScript answers by event id, for the outcome-contract tests: ok
// succeeds, flaky is 503 once, poison is 422, later is 429 with Retry-After:
// 1 once, gone is 410, and anything else 500 for ever.
func contractScript(w http.ResponseWriter, c call, prior []call) {
	switch c.Header.Get("Ce-Id") {
	case "ok":
		w.WriteHeader(http.StatusOK)
	case "flaky":
		if len(prior) == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	case "poison":
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = w.Write([]byte("bad sku"))
	case "later":
		if len(prior) == 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	case "gone":
		w.WriteHeader(http.StatusGone)
	default:
		w.WriteHeader(http.StatusInternalServerError)
	}
}

func status(code int) func(http.ResponseWriter, call, []call) {
	return func(w http.ResponseWriter, _ call, _ []call) { w.WriteHeader(code) }
}

// testConfig is a config for one RabbitMQ source with short tiers.
func testConfig(appURL, queue string, tiers ...time.Duration) config.Config {
	cfg := config.Default()
	cfg.Handler.URL = appURL
	cfg.Handler.Timeout = config.Duration(2 * time.Second)
	cfg.Handler.MaxConcurrency = 16
	declare := true
	cfg.Sources = []config.Source{{Name: "test", RabbitMQ: &config.RabbitMQ{URL: brokertest.RabbitURL(), Queue: queue, Prefetch: 16, Declare: &declare}}}
	cfg.Retry.Tiers = nil
	for _, d := range tiers {
		cfg.Retry.Tiers = append(cfg.Retry.Tiers, config.Duration(d))
	}
	cfg.Retry.MaxAttempts = 3
	cfg.Retry.Base = config.Duration(50 * time.Millisecond)
	cfg.Retry.Cap = config.Duration(200 * time.Millisecond)
	cfg.Shutdown.DrainTimeout = config.Duration(5 * time.Second)
	return cfg
}

// inProcess is a sidecar built and run in-process until the returned stop is called (or the
// test ends) and reports its result.
type inProcess struct {
	cancel context.CancelFunc
	done   chan error
	health string // the health server's address
	admin  string // the admin API's address, when it is on
}

func startSidecar(t *testing.T, cfg config.Config) *inProcess {
	t.Helper()
	return startSidecarWith(t, cfg, sidecar.Options{})
}

// startSidecarWith builds the sidecar cfg describes with o, runs it, and
// returns once /readyz says every connection is up.
func startSidecarWith(t *testing.T, cfg config.Config, o sidecar.Options) *inProcess {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("test config invalid: %v", err)
	}
	o.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Telemetry.MetricsListen = "127.0.0.1:0"
	if cfg.Journal.Path == config.Default().Journal.Path {
		cfg.Journal.Path = filepath.Join(t.TempDir(), "handoff.db")
	}
	sc, err := sidecar.Build(cfg, o)
	if err != nil {
		t.Fatalf("sidecar: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &inProcess{cancel: cancel, done: make(chan error, 1), health: sc.HealthAddr(), admin: sc.AdminAddr()}
	go func() { s.done <- sc.Run(ctx) }()
	t.Cleanup(func() { s.stop(t) })
	testkit.Eventually(t, 15*time.Second, "/readyz", func() bool {
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("sidecar stopped at start: %v", err)
		default:
		}
		resp, err := http.Get("http://" + s.health + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return s
}

func exists(conn *amqp.Connection, queue string) bool {
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return err == nil
}

func (s *inProcess) stop(t *testing.T) {
	t.Helper()
	if err := s.halt(); err != nil {
		t.Errorf("sidecar: %v", err)
	}
}

// halt stops the sidecar and returns what serve returned.
func (s *inProcess) halt() error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	s.cancel = nil
	select {
	case err := <-s.done:
		return err
	case <-time.After(30 * time.Second):
		return errors.New("sidecar did not stop within 30s")
	}
}

// testWriter sends logs to t.Log, and stops once the test is over.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // a log line after the test ended
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// waitSettled waits until the sidecar has taken at least received
// deliveries since it started and holds none of them unsettled: each one it
// took has been acked, handed back or moved on, so whatever it would do
// with them is done.
func waitSettled(t *testing.T, s *inProcess, received int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%d deliveries taken and settled", received), func() bool {
		fams := scrape(t, s.health)
		return sample(fams, "handoff_messages_received_total", nil) >= float64(received) &&
			sample(fams, "handoff_oldest_unsettled_age_seconds", nil) == 0
	})
}

// testVhost creates a vhost of its own for a test that disrupts every
// connection in it, and returns its AMQP URL.
func testVhost(t *testing.T) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	vhost := "test-" + hex.EncodeToString(b[:])
	rabbitmqctl(t, "add_vhost", vhost)
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "delete_vhost", vhost).Run() })
	rabbitmqctl(t, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
	return strings.TrimSuffix(brokertest.RabbitURL(), "/") + "/" + vhost
}

func rabbitmqctl(t *testing.T, args ...string) {
	t.Helper()
	brokertest.SkipShort(t, "RabbitMQ")
	out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
}
