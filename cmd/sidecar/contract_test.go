package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// The outcome contract as one table with two spellings, one per transport:
// each row is what the app answers an event's first attempt with over HTTP
// and over gRPC, and what must follow. The table runs against an HTTP app
// and a gRPC app, on RabbitMQ and Kafka, one message at a time and in
// batches; before it, the app is down for a while, and after it, one call
// outlives its deadline.

// httpAnswer is what the HTTP test app answers one event with.
type httpAnswer struct {
	status     int
	outcome    string // Handoff-Outcome
	retryAfter string
}

type contractCase struct {
	id   string
	http httpAnswer
	grpc grpcAnswer
	// always gives every attempt the first one's answer; otherwise later
	// attempts succeed.
	always bool
	calls  int           // calls the app gets
	dead   string        // the dead-letter reason; "" for none
	gap    time.Duration // the least time between the first two calls
	// redelivered: the second call says the app may have seen the event.
	redelivered bool
}

const contractTier = 400 * time.Millisecond

var (
	ok200   = httpAnswer{status: http.StatusOK}
	grpcOK  = grpcAnswer{}
	retried = func(id string, h httpAnswer, g grpcAnswer) contractCase {
		return contractCase{id: id, http: h, grpc: g, calls: 2, gap: contractTier}
	}
	deadLettered = func(id string, h httpAnswer, g grpcAnswer) contractCase {
		return contractCase{id: id, http: h, grpc: g, calls: 1, dead: "permanent"}
	}
	code = func(c codes.Code) grpcAnswer { return grpcAnswer{code: c, detail: "status " + c.String()} }
	enum = func(o handlerv1.Outcome) grpcAnswer { return grpcAnswer{outcome: o, detail: "outcome " + o.String()} }
)

var contractTable = []contractCase{
	// Success: OK with no verdict, or with SUCCESS.
	{id: "ok", http: ok200, grpc: grpcOK, calls: 1},
	{id: "success", http: httpAnswer{status: 500, outcome: "success"}, grpc: enum(handlerv1.Outcome_OUTCOME_SUCCESS), calls: 1},
	// Each outcome enum, and its HTTP spelling.
	retried("retry", httpAnswer{status: 200, outcome: "retry"}, enum(handlerv1.Outcome_OUTCOME_RETRY)),
	{id: "overload-after", http: httpAnswer{status: 429, retryAfter: "1"},
		grpc: grpcAnswer{outcome: handlerv1.Outcome_OUTCOME_OVERLOAD, retryAfter: time.Second}, calls: 2, gap: time.Second},
	retried("defer", httpAnswer{status: 409}, enum(handlerv1.Outcome_OUTCOME_DEFER)),
	deadLettered("permanent", httpAnswer{status: 422}, enum(handlerv1.Outcome_OUTCOME_PERMANENT)),
	{id: "drop", http: httpAnswer{status: 410}, grpc: enum(handlerv1.Outcome_OUTCOME_DROP), calls: 1},
	// Each status code the app may answer with, and an HTTP status that
	// means the same.
	retried("unavailable", httpAnswer{status: 500}, code(codes.Unavailable)),
	retried("aborted", httpAnswer{status: 502}, code(codes.Aborted)),
	retried("internal", httpAnswer{status: 500}, code(codes.Internal)),
	retried("unknown-code", httpAnswer{status: 504}, code(codes.Unknown)),
	retried("data-loss", httpAnswer{status: 500}, code(codes.DataLoss)),
	retried("resource-exhausted", httpAnswer{status: 503}, code(codes.ResourceExhausted)),
	{id: "deadline-exceeded", http: httpAnswer{status: 200, outcome: "unknown"}, grpc: code(codes.DeadlineExceeded), calls: 2, gap: contractTier, redelivered: true},
	{id: "cancelled", http: httpAnswer{status: 200, outcome: "unknown"}, grpc: code(codes.Canceled), calls: 2, gap: contractTier, redelivered: true},
	retried("failed-precondition", httpAnswer{status: 409}, code(codes.FailedPrecondition)),
	deadLettered("invalid-argument", httpAnswer{status: 400}, code(codes.InvalidArgument)),
	deadLettered("unimplemented", httpAnswer{status: 404}, code(codes.Unimplemented)),
	deadLettered("not-found", httpAnswer{status: 404}, code(codes.NotFound)),
	deadLettered("out-of-range", httpAnswer{status: 416}, code(codes.OutOfRange)),
	deadLettered("permission-denied", httpAnswer{status: 403}, code(codes.PermissionDenied)),
	deadLettered("unauthenticated", httpAnswer{status: 401}, code(codes.Unauthenticated)),
	deadLettered("already-exists", httpAnswer{status: 415}, code(codes.AlreadyExists)),
	// A failure that never ends: every attempt, then the dead letters.
	{id: "broken", http: httpAnswer{status: 500}, grpc: code(codes.Internal), always: true, calls: 3, dead: "max-attempts"},
}

// contractTransport is an app that answers by the table.
type contractTransport struct {
	name string
	// app returns the recording, the handler URL, and serve, which starts
	// the app on that URL's address: until then nothing listens there.
	app func(t *testing.T, answer func(c call, prior []call) (contractCase, bool)) (rec *app, url string, serve func())
}

var contractTransports = []contractTransport{
	{"http", func(t *testing.T, answer func(call, []call) (contractCase, bool)) (*app, string, func()) {
		a := &app{t: t, addr: freeAddr(t), respond: func(w http.ResponseWriter, c call, prior []call) {
			row, hang := answer(c, prior)
			if hang {
				time.Sleep(contractTimeout + time.Second) // a handler that outlives the call
			}
			if row.http.outcome != "" {
				w.Header().Set("Handoff-Outcome", row.http.outcome)
			}
			if row.http.retryAfter != "" {
				w.Header().Set("Retry-After", row.http.retryAfter)
			}
			w.WriteHeader(row.http.status)
			_, _ = fmt.Fprintf(w, "answer for %s", row.id)
		}}
		t.Cleanup(a.stop)
		return a, a.url(), func() {
			ln, err := net.Listen("tcp", a.addr)
			if err != nil {
				t.Fatal(err)
			}
			a.serve(ln)
		}
	}},
	{"grpc", func(t *testing.T, answer func(call, []call) (contractCase, bool)) (*app, string, func()) {
		g := newGRPCApp(t, func(c call, prior []call) grpcAnswer {
			row, hang := answer(c, prior)
			ans := row.grpc
			ans.hang = hang
			return ans
		})
		g.rec.addr = freeAddr(t)
		addr := g.rec.addr
		return g.rec, g.url(), func() { g.serve(t, addr) }
	}},
}

// contractTimeout is the handler timeout of the contract runs. Every row's
// first answer must come within it, or the row is tried again as unknown
// and answered as a retry's second attempt: with a core taken and the race
// detector, a gRPC app's first calls once took 1.44 s, past the 1 s this
// was. The timeout row hangs past it, so the run is that much longer.
const contractTimeout = 5 * time.Second

// freeAddr is a loopback address nothing listens on yet, for an app the
// test starts later. Its port is below the kernel's ephemeral range
// (32768 and up on Linux): a port handed out by a listen on :0 and closed
// again went back to that range, where any test's next connection or
// listener could take it before the app did ("address already in use").
// Nothing takes a port below the range but an explicit listen; the
// brokers' own ports are passed over.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		if port >= 25000 && port < 26000 { // RabbitMQ's distribution port, 25672
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		return addr
	}
	t.Fatal("no free loopback port between 20000 and 32000")
	return ""
}

// contractBroker is a broker to run the table on.
type contractBroker struct {
	name string
	// open makes a source of the test's own and returns the sidecar's
	// config, a publisher of events by id (body "body-<id>"), and a reader
	// of the dead letters so far: reason by event id, and each one's body.
	open func(t *testing.T, appURL string) (cfg config.Config, publish func(ids ...string), dead func() map[string][2]string)
}

func contractBrokers() []contractBroker {
	tiers := []time.Duration{contractTier, 2 * contractTier}
	out := []contractBroker{{"rabbitmq", func(t *testing.T, appURL string) (config.Config, func(...string), func() map[string][2]string) {
		conn := dialRabbit(t)
		q := testQueue(t, conn, tiers)
		cfg := testConfig(appURL, q, tiers...)
		dlq := rabbitmq.DeadLetterQueue(q)
		seen := map[string][2]string{}
		return cfg, func(ids ...string) {
				var msgs []publishing
				for _, id := range ids {
					msgs = append(msgs, publishing{MessageId: id, ContentType: "application/octet-stream", Body: []byte("body-" + id)})
				}
				publish(t, conn, q, msgs...)
			}, func() map[string][2]string {
				for _, d := range readStream(t, conn, dlq) {
					id, _ := d.Headers[broker.HeaderEventID].(string)
					reason, _ := d.Headers[broker.HeaderDeadReason].(string)
					seen[id] = [2]string{reason, string(d.Body)}
				}
				return seen
			}
	}}}
	for _, b := range kafkaBackends() {
		for _, share := range []bool{false, true} {
			name := "kafka-" + b.name
			if share {
				name += "-share"
			}
			out = append(out, contractBroker{name, kafkaContract(b, share, tiers)})
		}
	}
	return out
}

// kafkaContract opens a topic of b's for the table, consumed through a
// consumer group or, with share, a share group of the same name.
func kafkaContract(b kafkaBackend, share bool, tiers []time.Duration) func(t *testing.T, appURL string) (config.Config, func(...string), func() map[string][2]string) {
	return func(t *testing.T, appURL string) (config.Config, func(...string), func() map[string][2]string) {
		brokers, topic := b.topic(t, "contract", 3)
		cfg := kafkaConfig(appURL, brokers, topic, tiers...)
		if k := cfg.Sources[0].Kafka; share {
			k.Group, k.ShareGroup = "", kafkaGroup(topic)
		}
		dlq := kafka.DeadLetterTopic(topic, kafkaGroup(topic))
		return cfg, func(ids ...string) {
				var recs []*kgo.Record
				for _, id := range ids {
					recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("key-" + id), Value: []byte("body-" + id),
						Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}})
				}
				produceKafka(t, brokers, recs...)
			}, func() map[string][2]string {
				out := map[string][2]string{}
				for _, r := range readTopic(t, brokers, dlq) {
					out[header(r, broker.HeaderEventID)] = [2]string{header(r, broker.HeaderDeadReason), string(r.Value)}
				}
				return out
			}
	}
}

func TestOutcomeContractBothTransports(t *testing.T) {
	t.Parallel()
	for _, b := range contractBrokers() {
		for _, batch := range []int{0, 8} {
			for _, tr := range contractTransports {
				mode := "single"
				if batch > 0 {
					mode = "batch"
				}
				t.Run(b.name+"/"+mode+"/"+tr.name, func(t *testing.T) {
					t.Parallel()
					testOutcomeContract(t, b, tr, batch)
				})
			}
		}
	}
}

func testOutcomeContract(t *testing.T, b contractBroker, tr contractTransport, batch int) {
	rows := map[string]contractCase{}
	for _, row := range contractTable {
		rows[row.id] = row
	}
	a, url, serve := tr.app(t, func(c call, prior []call) (contractCase, bool) {
		id := c.Header.Get("Ce-Id")
		if id == "timeout" {
			// The first call outlives its deadline; the next succeeds.
			return contractCase{id: id, http: ok200, grpc: grpcOK}, len(prior) == 0
		}
		row, ok := rows[id]
		if !ok || len(prior) > 0 && !row.always {
			return contractCase{id: id, http: ok200, grpc: grpcOK}, false
		}
		return row, false
	})
	cfg, publish, dead := b.open(t, url)
	cfg.Retry.MaxAttempts = 3
	cfg.Handler.Timeout = config.Duration(contractTimeout)
	cfg.Handler.Batch = config.Batch{MaxMessages: batch, MaxWait: config.Duration(50 * time.Millisecond)}
	s := startSidecar(t, cfg)

	// The app is down: the sidecar holds its messages and says it is not
	// ready; no attempt is spent. Once the app is up each is handed over,
	// as its first attempt.
	down := []string{"down-0", "down-1", "down-2"}
	publish(down...)
	testkit.Eventually(t, 20*time.Second, "/readyz to report the app unreachable", func() bool {
		resp, err := http.Get("http://" + s.health + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	serve()
	testkit.Eventually(t, 20*time.Second, "the held messages once the app is up", func() bool {
		for _, id := range down {
			if len(a.callsFor(id)) == 0 {
				return false
			}
		}
		return true
	})

	// The table.
	var ids []string
	wantDead := map[string]string{}
	for _, row := range contractTable {
		ids = append(ids, row.id)
		if row.dead != "" {
			wantDead[row.id] = row.dead
		}
	}
	publish(ids...)
	var got map[string][2]string
	testkit.Eventually(t, 40*time.Second, "every row's calls and dead letters", func() bool {
		for _, row := range contractTable {
			if len(a.callsFor(row.id)) < row.calls {
				return false
			}
		}
		got = dead()
		return len(got) >= len(wantDead)
	})

	// One call outlives its deadline: unknown, and the next attempt says the
	// app may have seen the event.
	publish("timeout")
	testkit.Eventually(t, 20*time.Second, "the attempt after a timeout", func() bool { return len(a.callsFor("timeout")) >= 2 })
	time.Sleep(3 * contractTier) // any extra call would come by now
	s.stop(t)

	for _, id := range down {
		if c := a.callsFor(id); len(c) != 1 || c[0].Header.Get("Handoff-Attempt") != "1" {
			t.Errorf("%s (held while the app was down): %d calls, first attempt %q; want one call, attempt 1", id, len(c), attemptOf(c))
		}
	}
	for _, row := range contractTable {
		c := a.callsFor(row.id)
		if len(c) != row.calls {
			t.Errorf("%s: %d calls, want %d", row.id, len(c), row.calls)
			continue
		}
		if c[0].Header.Get("Handoff-Attempt") != "1" || c[0].Header.Get("Handoff-Redelivered") != "false" || string(c[0].Body) != "body-"+row.id {
			t.Errorf("%s: first call attempt %q redelivered %q body %q", row.id, c[0].Header.Get("Handoff-Attempt"), c[0].Header.Get("Handoff-Redelivered"), c[0].Body)
		}
		if len(c) < 2 {
			continue
		}
		if gap := c[1].At.Sub(c[0].At); gap < row.gap {
			t.Errorf("%s: second call %v after the first, want >= %v", row.id, gap, row.gap)
		}
		if r := c[1].Header.Get("Handoff-Redelivered"); r != fmt.Sprint(row.redelivered) {
			t.Errorf("%s: second call redelivered %q, want %v", row.id, r, row.redelivered)
		}
	}
	if c := a.callsFor("timeout"); len(c) != 2 || c[0].Header.Get("Handoff-Redelivered") != "false" || c[1].Header.Get("Handoff-Redelivered") != "true" {
		t.Errorf("timeout: %d calls, redelivered %q; want 2 calls, the second redelivered", len(c), redeliveredOf(c))
	}
	got = dead()
	var wrong []string
	for id, want := range wantDead {
		if got[id][0] != want || got[id][1] != "body-"+id {
			wrong = append(wrong, fmt.Sprintf("%s: reason %q body %q, want %q", id, got[id][0], got[id][1], want))
		}
	}
	for id := range got {
		if _, ok := wantDead[id]; !ok {
			wrong = append(wrong, id+": dead-lettered, want not")
		}
	}
	sort.Strings(wrong)
	if len(wrong) > 0 {
		t.Errorf("dead letters:\n%s", strings.Join(wrong, "\n"))
	}
	if batch > 0 && a.largestBatch() < 2 {
		t.Errorf("batch delivery on, but no request carried more than %d event", a.largestBatch())
	}
	if batch == 0 && a.largestBatch() > 0 {
		t.Error("a batch request with batch delivery off")
	}
}

func attemptOf(c []call) string {
	if len(c) == 0 {
		return ""
	}
	return c[0].Header.Get("Handoff-Attempt")
}

func redeliveredOf(c []call) []string {
	var out []string
	for _, x := range c {
		out = append(out, x.Header.Get("Handoff-Redelivered"))
	}
	return out
}
