package dispatch

import (
	"context"
	"sync"
	"testing"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
)

const envelope = `{"specversion":"1.0","id":"order-7","source":"/shop","type":"order.placed","data":{"n":1}}`

func TestStructuredEventIdentity(t *testing.T) {
	tests := []struct {
		name    string
		msg     broker.Message
		want    string
		event   bool // m.Event is set
		invalid bool // readEvent fails
	}{
		{"structured id wins over position", broker.Message{ContentType: broker.StructuredContentType, Body: []byte(envelope), Position: "kafka:t/0/9"}, "order-7", true, false},
		{"with a charset", broker.Message{ContentType: "application/cloudevents+json; charset=utf-8", Body: []byte(envelope), MessageID: "m-1"}, "order-7", true, false},
		{"structured id wins over binary headers", broker.Message{ContentType: broker.StructuredContentType, Body: []byte(envelope), Headers: broker.Headers{"ce_id": "hdr"}}, "order-7", true, false},
		{"json body is a body", broker.Message{ContentType: "application/json", Body: []byte(envelope), Position: "kafka:t/0/9"}, "kafka:t/0/9", false, false},
		{"unreadable keeps the fallback id", broker.Message{ContentType: broker.StructuredContentType, Body: []byte(`{"id":"x"}`), Position: "kafka:t/0/9"}, "kafka:t/0/9", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.msg
			err := readEvent(&m)
			if (err != nil) != tt.invalid {
				t.Fatalf("readEvent = %v, want error %v", err, tt.invalid)
			}
			if (m.Event != nil) != tt.event {
				t.Fatalf("Event = %+v, want set %v", m.Event, tt.event)
			}
			if string(m.Body) != string(tt.msg.Body) {
				t.Errorf("body changed: %q", m.Body)
			}
			if id, hashed := eventID(&m); id != tt.want || hashed {
				t.Errorf("eventID = %q, %v; want %q", id, hashed, tt.want)
			}
		})
	}
}

// recordingApp answers success and keeps each request's event id and data.
type recordingApp struct {
	mu   sync.Mutex
	reqs []handler.Request
}

func (a *recordingApp) Deliver(_ context.Context, r *handler.Request) handler.Result {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reqs = append(a.reqs, *r)
	return handler.Result{Outcome: budget.Success}
}

func (a *recordingApp) Probe(context.Context) error { return nil }

func (a *recordingApp) calls() []handler.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]handler.Request(nil), a.reqs...)
}

func TestStructuredEventReachesTheAppAsItself(t *testing.T) {
	r := newRig(t)
	app := &recordingApp{}
	d := r.delivery("")
	d.msg.ContentType = broker.StructuredContentType
	d.msg.Body = []byte(envelope)
	d.msg.Position = "kafka:t/0/9"
	e := r.engine(1, d)
	e.o.Handler = app
	run(t, e, func() bool { return len(r.snapshot()) == 1 })
	calls := app.calls()
	if len(calls) != 1 {
		t.Fatalf("app called %d times", len(calls))
	}
	got := calls[0]
	if got.EventID != "order-7" || got.Message.Event == nil || string(got.Message.Data()) != `{"n":1}` {
		t.Errorf("app got id %q, data %q", got.EventID, got.Message.Data())
	}
	if st, err := r.journal.State(journal.Key{Source: "fake", EventID: "order-7"}); err != nil || !st.Found {
		t.Errorf("journal has no history under the event's own id: %+v, %v", st, err)
	}
}

func TestUnreadableStructuredEventIsDeadLetteredAsMalformed(t *testing.T) {
	r := newRig(t, budget.Success)
	d := r.delivery("")
	d.msg.ContentType = broker.StructuredContentType
	d.msg.Body = []byte(`{"id":"order-8","source":"/shop","type":"order.placed"}`) // no specversion
	d.msg.Position = "kafka:t/0/10"
	e := r.engine(1, d)
	run(t, e, func() bool { return len(r.snapshot()) == 2 })
	if got := kinds(r.snapshot()); len(got) != 2 || got[0] != "transfer" || got[1] != "ack" {
		t.Fatalf("events = %v, want a transfer then an ack", got)
	}
	if dest := r.snapshot()[0].dest; !dest.DeadLetter {
		t.Errorf("copy went to %v, want the DLQ", dest)
	}
	if len(r.app.attempts) != 0 {
		t.Errorf("the app was called %d times", len(r.app.attempts))
	}
	st, err := r.journal.State(journal.Key{Source: "fake", EventID: "kafka:t/0/10"})
	if err != nil || st.Copy == nil {
		t.Fatalf("journal: %+v, %v", st, err)
	}
	tr := st.Copy.Trail
	if tr[broker.HeaderDeadReason] != string(budget.ReasonMalformed) || tr[broker.HeaderErrorClass] != "malformed" ||
		tr[broker.HeaderError] == "" {
		t.Errorf("copy trail = %v, want reason malformed with its evidence", tr)
	}
}

func TestUnreadableStructuredEventIsDeadLetteredOnce(t *testing.T) {
	r := newRig(t, budget.Success)
	bad := func() *fakeDelivery {
		d := r.delivery("")
		d.msg.ContentType = broker.StructuredContentType
		d.msg.Body = []byte(`{"id":`)
		d.msg.Position = "kafka:t/0/11"
		return d
	}
	run(t, r.engine(1, bad()), func() bool { return len(r.snapshot()) == 2 })
	// The same record again, as after a crash between the confirm and the
	// commit: the journal knows its copy, so it is settled, not copied twice.
	run(t, r.engine(1, bad()), func() bool { return len(r.snapshot()) == 3 })
	if got := kinds(r.snapshot()); len(got) != 3 || got[0] != "transfer" || got[1] != "ack" || got[2] != "ack" {
		t.Fatalf("events = %v, want transfer, ack, then only an ack", got)
	}
}
