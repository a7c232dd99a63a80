package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/testkit"
)

// Messages in the CloudEvents structured content mode, through the real
// sidecar, read by an app written on the CloudEvents Go SDK: it gets each
// event itself — its own id, attributes and data — in binary and in batch
// mode, and the journal and dead-letter copies know it by the same id.

const structuredCT = "application/cloudevents+json; charset=utf-8"

var binData = []byte{0x00, 0x01, 0x02, 0xff, 'x'}

// structuredInput is what each test publishes, by the id the app or the
// dead-letter queue should know it by ("" for unreadable envelopes, which
// have no id of their own).
var structuredInput = []struct {
	id, body string
	reason   string // the dead-letter reason, "" when the app handles it
}{
	{id: "ok-json", body: `{"specversion":"1.0","id":"ok-json","source":"/shop","type":"order.placed","subject":"o/1",` +
		`"time":"2026-01-01T10:00:00Z","tenant":"acme","datacontenttype":"application/json","data":{"sku":"a-1","n":2}}`},
	{id: "ok-bin", body: `{"specversion":"1.0","id":"ok-bin","source":"/shop","type":"order.scanned",` +
		`"datacontenttype":"application/octet-stream","data_base64":"` + base64.StdEncoding.EncodeToString(binData) + `"}`},
	{id: "fail-1", reason: "max-attempts", body: `{"specversion":"1.0","id":"fail-1","source":"/shop","type":"order.placed","data":{"sku":"zz"}}`},
	{reason: "malformed", body: `{"id":"bad-1","source":"/shop","type":"order.placed","data":{}}`}, // no specversion
	{reason: "malformed", body: `{"specversion":"1.0","id":"bad-2",`},                              // not JSON
}

// sdkApp reads every request with the CloudEvents SDK and answers 500 for
// the events whose id starts with "fail", 200 for the others.
type sdkApp struct {
	t      *testing.T
	srv    *httptest.Server
	mu     sync.Mutex
	events map[string][]cloudevents.Event
}

func newSDKApp(t *testing.T) *sdkApp {
	a := &sdkApp{t: t, events: map[string][]cloudevents.Event{}}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *sdkApp) url() string { return a.srv.URL + "/events" }

func sdkStatus(id string) int {
	if strings.HasPrefix(id, "fail") {
		return http.StatusInternalServerError
	}
	return http.StatusOK
}

func (a *sdkApp) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Content-Type") == handler.BatchContentType {
		evs, err := cehttp.NewEventsFromHTTPRequest(r)
		if err != nil {
			a.t.Errorf("the SDK cannot read the batch: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var results []map[string]any
		for _, e := range evs {
			a.record(e)
			results = append(results, map[string]any{"id": e.ID(), "status": sdkStatus(e.ID())})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
		return
	}
	e, err := cehttp.NewEventFromHTTPRequest(r)
	if err != nil {
		a.t.Errorf("the SDK cannot read the request: %v", err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	a.record(*e)
	w.WriteHeader(sdkStatus(e.ID()))
}

func (a *sdkApp) record(e cloudevents.Event) {
	if err := e.Validate(); err != nil {
		a.t.Errorf("event %s is not valid: %v", e.ID(), err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events[e.ID()] = append(a.events[e.ID()], e)
}

func (a *sdkApp) got(id string) []cloudevents.Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]cloudevents.Event(nil), a.events[id]...)
}

// check fails t unless the app got each event itself, and nothing else.
func (a *sdkApp) check(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	for id := range a.events {
		if id != "ok-json" && id != "ok-bin" && id != "fail-1" {
			t.Errorf("the app got an event with id %q: not an event's own id", id)
		}
	}
	a.mu.Unlock()
	if evs := a.got("ok-json"); len(evs) != 1 {
		t.Errorf("ok-json reached the app %d times, want 1", len(evs))
	} else {
		e := evs[0]
		if e.Source() != "/shop" || e.Type() != "order.placed" || e.Subject() != "o/1" ||
			!e.Time().Equal(time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)) || e.DataContentType() != "application/json" {
			t.Errorf("ok-json attributes: %v", e)
		}
		if v := e.Extensions()["tenant"]; v != "acme" {
			t.Errorf("ok-json extension tenant = %v, want acme", v)
		}
		var data, want bytes.Buffer
		_ = json.Compact(&want, []byte(`{"sku":"a-1","n":2}`))
		if err := json.Compact(&data, e.Data()); err != nil || data.String() != want.String() {
			t.Errorf("ok-json data = %s, want %s", e.Data(), want.String())
		}
	}
	if evs := a.got("ok-bin"); len(evs) != 1 {
		t.Errorf("ok-bin reached the app %d times, want 1", len(evs))
	} else if e := evs[0]; !bytes.Equal(e.Data(), binData) || e.DataContentType() != "application/octet-stream" || e.Type() != "order.scanned" {
		t.Errorf("ok-bin: data %x, content type %q, type %q; want %x, application/octet-stream, order.scanned",
			e.Data(), e.DataContentType(), e.Type(), binData)
	}
	if evs := a.got("fail-1"); len(evs) != 3 {
		t.Errorf("fail-1 reached the app %d times, want 3", len(evs))
	}
}

// dlqCopy is a dead-letter copy as read back from the broker.
type dlqCopy struct {
	eventID, reason, errText, contentType string
	body                                  []byte
}

// checkStructuredDLQ fails t unless the dead letters are exactly the failed
// and the malformed inputs, each with its body byte for byte.
func checkStructuredDLQ(t *testing.T, copies []dlqCopy) {
	t.Helper()
	if len(copies) != 3 {
		t.Errorf("DLQ holds %d copies, want 3", len(copies))
	}
	for _, in := range structuredInput {
		if in.reason == "" {
			continue
		}
		var c *dlqCopy
		for i := range copies {
			if string(copies[i].body) == in.body {
				c = &copies[i]
			}
		}
		if c == nil {
			t.Errorf("no DLQ copy with the body %s, byte for byte", in.body)
			continue
		}
		if c.reason != in.reason || c.contentType != structuredCT {
			t.Errorf("DLQ copy of %s: reason %q, content type %q; want %q, %q", in.body, c.reason, c.contentType, in.reason, structuredCT)
		}
		if in.id != "" && c.eventID != in.id {
			t.Errorf("DLQ copy of %s: %s = %q, want the event's own id %q", in.body, broker.HeaderEventID, c.eventID, in.id)
		}
		if in.reason == "malformed" && !strings.Contains(c.errText, "structured event") {
			t.Errorf("malformed DLQ copy of %s: %s = %q, want the reason it is unreadable", in.body, broker.HeaderError, c.errText)
		}
	}
}

// checkStructuredJournal fails t unless the journal holds fail-1's whole
// history under its own id: three attempts, then its dead-letter copy.
func checkStructuredJournal(t *testing.T, path string) {
	t.Helper()
	var attempts, dlq int
	for _, s := range timeline(t, path, "test", "fail-1") {
		switch {
		case s.Kind == journal.Attempt:
			attempts++
		case s.Kind == journal.Transferred && s.Dest == "dlq":
			dlq++
		}
	}
	if attempts != 3 || dlq != 1 {
		t.Errorf("journal timeline of fail-1: %d attempts, %d dead-letter copies; want 3 and 1", attempts, dlq)
	}
}

func structuredConfig(t *testing.T, cfg *config.Config, batch int) {
	cfg.Journal.Path = filepath.Join(t.TempDir(), "handoff.db")
	if batch > 1 {
		cfg.Handler.Batch = config.Batch{MaxMessages: batch, MaxWait: config.Duration(20 * time.Millisecond)}
	}
}

var structuredModes = []struct {
	name  string
	batch int
}{{"binary", 0}, {"batch", 8}}

func TestRabbitStructuredEvents(t *testing.T) {
	t.Parallel()
	for _, mode := range structuredModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			conn := dialRabbit(t)
			q := testQueue(t, conn, []time.Duration{tier})
			a := newSDKApp(t)
			cfg := testConfig(a.url(), q, tier)
			structuredConfig(t, &cfg, mode.batch)
			s := startSidecar(t, cfg)

			var msgs []publishing
			for _, in := range structuredInput {
				msgs = append(msgs, publishing{ContentType: structuredCT, Body: []byte(in.body),
					Headers: amqp.Table{"x-tenant": "acme"}})
			}
			publish(t, conn, q, msgs...)
			dlq := rabbitmq.DeadLetterQueue(q)
			testkit.Eventually(t, 30*time.Second, "the events handled and the failures dead-lettered", func() bool {
				return len(a.got("ok-json")) > 0 && len(a.got("ok-bin")) > 0 && len(readStream(t, conn, dlq)) == 3
			})
			s.stop(t)

			a.check(t)
			var copies []dlqCopy
			for _, d := range readStream(t, conn, dlq) {
				c := dlqCopy{body: d.Body, contentType: d.ContentType}
				c.eventID, _ = d.Headers[broker.HeaderEventID].(string)
				c.reason, _ = d.Headers[broker.HeaderDeadReason].(string)
				c.errText, _ = d.Headers[broker.HeaderError].(string)
				copies = append(copies, c)
			}
			checkStructuredDLQ(t, copies)
			checkStructuredJournal(t, cfg.Journal.Path)
			if n := depth(t, conn, q); n != 0 {
				t.Errorf("source holds %d, want 0", n)
			}
		})
	}
}

func TestKafkaStructuredEvents(t *testing.T) {
	t.Parallel()
	for _, b := range kafkaBackends() {
		for _, mode := range structuredModes {
			t.Run(b.name+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				brokers, topic := b.topic(t, "structured", 1)
				a := newSDKApp(t)
				cfg := kafkaConfig(a.url(), brokers, topic, tier)
				structuredConfig(t, &cfg, mode.batch)
				s := startSidecar(t, cfg)

				var recs []*kgo.Record
				for _, in := range structuredInput {
					recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(in.body),
						Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte(structuredCT)}}})
				}
				produceKafka(t, brokers, recs...)
				dlq := kafka.DeadLetterTopic(topic, kafkaGroup(topic))
				testkit.Eventually(t, 60*time.Second, "the events handled and the failures dead-lettered", func() bool {
					return len(a.got("ok-json")) > 0 && len(a.got("ok-bin")) > 0 && len(readTopic(t, brokers, dlq)) == 3
				})
				s.stop(t)

				a.check(t)
				var copies []dlqCopy
				for _, r := range readTopic(t, brokers, dlq) {
					copies = append(copies, dlqCopy{body: r.Value, contentType: header(r, "content-type"),
						eventID: header(r, broker.HeaderEventID), reason: header(r, broker.HeaderDeadReason),
						errText: header(r, broker.HeaderError)})
				}
				checkStructuredDLQ(t, copies)
				checkStructuredJournal(t, cfg.Journal.Path)
				checkCommittedAtLogEnd(t, brokers, topic)
			})
		}
	}
}
