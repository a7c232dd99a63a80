package handler

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// structuredRequest is an attempt of a structured-mode message, its event
// read as intake reads it.
func structuredRequest(t *testing.T, body string, headers broker.Headers) *Request {
	t.Helper()
	ev, err := broker.ParseStructured([]byte(body))
	if err != nil {
		t.Fatalf("ParseStructured: %v", err)
	}
	return &Request{
		Message: &broker.Message{Body: []byte(body), ContentType: broker.StructuredContentType + "; charset=utf-8",
			Type: "amqp.type", Headers: headers, Event: ev},
		EventID: ev.ID, Source: "urn:handoff:test", Type: "fallback", Attempt: 2,
		Deadline: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Timeout: 5 * time.Second,
	}
}

func TestDeliverStructuredEventInBinaryMode(t *testing.T) {
	tests := []struct {
		name        string
		body        string
		wantBody    string
		wantCT      string
		wantHeaders map[string]string
	}{
		{
			name:     "json data",
			body:     `{"specversion":"1.0","id":"order-1","source":"/shop","type":"order.placed","subject":"o/1","time":"2026-01-01T00:00:00Z","traceparent":"00-x","tries":3,"data":{"sku":"a"}}`,
			wantBody: `{"sku":"a"}`,
			wantCT:   "application/json",
			wantHeaders: map[string]string{"Ce-Subject": "o/1", "Ce-Time": "2026-01-01T00:00:00Z",
				"Ce-Traceparent": "00-x", "Ce-Tries": "3", "X-Tenant": "acme"},
		},
		{
			name:        "base64 data",
			body:        `{"specversion":"1.0","id":"order-1","source":"/shop","type":"order.placed","datacontenttype":"image/png","dataschema":"urn:s","data_base64":"iVBORw=="}`,
			wantBody:    "\x89PNG",
			wantCT:      "image/png",
			wantHeaders: map[string]string{"Ce-Dataschema": "urn:s"},
		},
		{
			name:     "text data",
			body:     `{"specversion":"1.0","id":"order-1","source":"/shop","type":"order.placed","datacontenttype":"text/plain","data":"hello"}`,
			wantBody: "hello",
			wantCT:   "text/plain",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// ce_* headers are not attributes of a structured event: they
			// are neither attributes nor passed on.
			r := structuredRequest(t, tt.body, broker.Headers{"x-tenant": "acme", "ce_source": "/forged", "ce_other": "o",
				"content-type": broker.StructuredContentType, broker.HeaderAttempt: "7"})
			got := deliverOnce(t, r)
			if string(got.body) != tt.wantBody {
				t.Errorf("body = %q, want %q", got.body, tt.wantBody)
			}
			wantHeader(t, got.header, "Content-Type", tt.wantCT)
			wantHeader(t, got.header, "Ce-Id", "order-1")
			wantHeader(t, got.header, "Ce-Source", "/shop")
			wantHeader(t, got.header, "Ce-Type", "order.placed")
			wantHeader(t, got.header, "Ce-Specversion", "1.0")
			wantHeader(t, got.header, "Handoff-Attempt", "2")
			for k, v := range tt.wantHeaders {
				wantHeader(t, got.header, k, v)
			}
			if v := got.header.Values("Ce-Other"); len(v) != 0 {
				t.Errorf("Ce-Other = %q: a ce_ header of a structured message was sent", v)
			}
			if string(r.Message.Body) != tt.body {
				t.Errorf("the message's body changed: %q", r.Message.Body)
			}
		})
	}
}

func TestBatchCarriesTheStructuredEventItself(t *testing.T) {
	tests := []struct {
		name string
		body string
		want map[string]any // members beside the handoff* extensions
	}{
		{
			name: "json data",
			body: `{"specversion":"1.0","id":"order-1","source":"/shop","type":"order.placed","subject":"o/1","tries":3,"data":{"sku":"a"}}`,
			want: map[string]any{"specversion": "1.0", "id": "order-1", "source": "/shop", "type": "order.placed",
				"subject": "o/1", "tries": "3", "datacontenttype": "application/json", "data": map[string]any{"sku": "a"}},
		},
		{
			name: "base64 data",
			body: `{"specversion":"1.0","id":"order-2","source":"/shop","type":"order.placed","datacontenttype":"image/png","data_base64":"iVBORw=="}`,
			want: map[string]any{"specversion": "1.0", "id": "order-2", "source": "/shop", "type": "order.placed",
				"datacontenttype": "image/png", "data_base64": "iVBORw=="},
		},
		{
			name: "no data",
			body: `{"specversion":"1.0","id":"order-3","source":"/shop","type":"order.placed"}`,
			want: map[string]any{"specversion": "1.0", "id": "order-3", "source": "/shop", "type": "order.placed"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := structuredRequest(t, tt.body, broker.Headers{"x-tenant": "acme", "ce_other": "o"})
			out := encodeBatch([]*Request{r})
			var events []map[string]any
			if err := json.Unmarshal(out, &events); err != nil || len(events) != 1 {
				t.Fatalf("batch %s: %v", out, err)
			}
			got := events[0]
			for k := range got {
				if len(k) > 7 && k[:7] == "handoff" {
					delete(got, k)
				}
			}
			gotJSON, _ := json.Marshal(got)
			wantJSON, _ := json.Marshal(tt.want)
			if string(gotJSON) != string(wantJSON) {
				t.Errorf("event = %s\nwant    %s", gotJSON, wantJSON)
			}
		})
	}
}

// FuzzStructuredHeaders: whatever envelope the decoder accepts, binary mode
// sends only valid headers carrying its attributes, and a batch holds it as
// a valid structured event with its own id.
func FuzzStructuredHeaders(f *testing.F) {
	for _, s := range []string{
		`{"specversion":"1.0","id":"a","source":"/s","type":"t","data":{"x":1}}`,
		`{"specversion":"1.0","id":"a b","source":"ü","type":"t","Bad Name":"v","ok":"\u2028","n":1e5,"data_base64":"AA=="}`,
		`{"specversion":"1.0","id":"a","source":"/s","type":"t","handoffattempt":"9","datacontenttype":"text/plain","data":"x"}`,
		`{"specversion":"1.0","id":"a","source":"/s","type":"t","content-length":"1","host":"evil"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := broker.ParseStructured(body)
		if err != nil {
			return
		}
		r := &Request{Message: &broker.Message{Body: body, ContentType: broker.StructuredContentType, Event: ev},
			EventID: ev.ID, Source: "src", Type: "typ", Attempt: 1}
		h := http.Header{}
		setHeaders(h, r)
		for name, vals := range h {
			if !isToken(name) {
				t.Errorf("header name %q is not an HTTP token", name)
			}
			for _, v := range vals {
				if !validValue(v) {
					t.Errorf("header %q has value %q with control characters", name, v)
				}
			}
		}
		for name, want := range map[string]string{"Ce-Id": ev.ID, "Ce-Source": ev.Source, "Ce-Type": ev.Type, "Handoff-Attempt": "1"} {
			if got := h.Get(name); got != want {
				t.Errorf("%s = %q, want %q", name, got, want)
			}
		}
		out := encodeBatch([]*Request{r})
		var events []map[string]json.RawMessage
		if err := json.Unmarshal(out, &events); err != nil || len(events) != 1 {
			t.Fatalf("batch %s: %v", out, err)
		}
		var id string
		if err := json.Unmarshal(events[0]["id"], &id); err != nil || id != ev.ID {
			t.Errorf("batch event id = %s, want %q", events[0]["id"], ev.ID)
		}
	})
}
