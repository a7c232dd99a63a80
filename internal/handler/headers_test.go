package handler

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
)

// deliverOnce hands r to a fresh loopback app and returns what the app saw.
// The call must succeed: a header problem may drop a header, never the call.
func deliverOnce(t *testing.T, r *Request) seen {
	t.Helper()
	srv, ch := recordingApp(t, nil)
	h := newClient(t, srv.URL, 1)
	res := h.Deliver(context.Background(), r)
	if res.Outcome != budget.Success || res.Status != http.StatusOK {
		t.Fatalf("Deliver = %+v, want success 200", res)
	}
	return one(t, ch)
}

// wantHeader fails t unless the app saw exactly one value want for name.
func wantHeader(t *testing.T, got http.Header, name, want string) {
	t.Helper()
	if v := got.Values(name); len(v) != 1 || v[0] != want {
		t.Errorf("%s = %q, want [%q]", name, v, want)
	}
}

func TestDeliverCloudEventsAttributes(t *testing.T) {
	tests := []struct {
		name       string
		msg        broker.Message
		req        func(r *Request)
		wantSource string
		wantType   string
	}{
		{
			name:       "request defaults",
			wantSource: "urn:handoff:test",
			wantType:   "com.example.fallback",
		},
		{
			name:       "message type property wins over request type",
			msg:        broker.Message{Type: "com.example.order.created"},
			wantSource: "urn:handoff:test",
			wantType:   "com.example.order.created",
		},
		{
			name:       "ce-type header wins over message type property",
			msg:        broker.Message{Type: "amqp.type", Headers: broker.Headers{"ce-type": "ce.type"}},
			wantSource: "urn:handoff:test",
			wantType:   "ce.type",
		},
		{name: "ce-source (HTTP)", msg: broker.Message{Headers: broker.Headers{"ce-source": "/orders"}}, wantSource: "/orders", wantType: "com.example.fallback"},
		{name: "ce_source (Kafka)", msg: broker.Message{Headers: broker.Headers{"ce_source": "/orders"}}, wantSource: "/orders", wantType: "com.example.fallback"},
		{name: "cloudEvents:source (AMQP)", msg: broker.Message{Headers: broker.Headers{"cloudEvents:source": "/orders"}}, wantSource: "/orders", wantType: "com.example.fallback"},
		{name: "cloudEvents_source (AMQP)", msg: broker.Message{Headers: broker.Headers{"cloudEvents_source": "/orders"}}, wantSource: "/orders", wantType: "com.example.fallback"},
		{name: "Ce-Source in upper case", msg: broker.Message{Headers: broker.Headers{"CE-SOURCE": "/orders"}}, wantSource: "/orders", wantType: "com.example.fallback"},
		{name: "ce_type (Kafka)", msg: broker.Message{Type: "amqp.type", Headers: broker.Headers{"ce_type": "kafka.type"}}, wantSource: "urn:handoff:test", wantType: "kafka.type"},
		{name: "cloudEvents:type (AMQP)", msg: broker.Message{Headers: broker.Headers{"cloudEvents:type": "amqp.ce.type"}}, wantSource: "urn:handoff:test", wantType: "amqp.ce.type"},
		{name: "cloudEvents_type (AMQP)", msg: broker.Message{Headers: broker.Headers{"cloudEvents_type": "amqp.ce.type"}}, wantSource: "urn:handoff:test", wantType: "amqp.ce.type"},
		{
			name:       "source and type both from headers",
			msg:        broker.Message{Type: "ignored", Headers: broker.Headers{"ce_source": "kafka://orders", "ce_type": "order.paid"}},
			wantSource: "kafka://orders",
			wantType:   "order.paid",
		},
		{
			name:       "ce-source with a control character falls back to the request",
			msg:        broker.Message{Headers: broker.Headers{"ce-source": "/orders\r\nX-Injected: 1"}},
			wantSource: "urn:handoff:test",
			wantType:   "com.example.fallback",
		},
		{
			name:       "ce-type with a control character falls back to the message type",
			msg:        broker.Message{Type: "com.example.safe", Headers: broker.Headers{"ce-type": "evil\ntype"}},
			wantSource: "urn:handoff:test",
			wantType:   "com.example.safe",
		},
		{
			name:       "message ce-id and ce-specversion do not override the sidecar's",
			msg:        broker.Message{Headers: broker.Headers{"ce-id": "forged-id", "ce_specversion": "0.3"}},
			wantSource: "urn:handoff:test",
			wantType:   "com.example.fallback",
		},
		{
			name:       "AMQP spellings of id and specversion do not override the sidecar's",
			msg:        broker.Message{Headers: broker.Headers{"cloudEvents:id": "forged-id", "cloudEvents_specversion": "0.3", "CE_ID": "forged-2"}},
			wantSource: "urn:handoff:test",
			wantType:   "com.example.fallback",
		},
		{
			name:       "event id from the request",
			req:        func(r *Request) { r.EventID = "kafka:orders/3/1207" },
			wantSource: "urn:handoff:test",
			wantType:   "com.example.fallback",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := tt.msg
			r := request(&msg)
			if tt.req != nil {
				tt.req(r)
			}
			s := deliverOnce(t, r)
			wantHeader(t, s.header, "Ce-Id", r.EventID)
			wantHeader(t, s.header, "Ce-Specversion", "1.0")
			wantHeader(t, s.header, "Ce-Source", tt.wantSource)
			wantHeader(t, s.header, "Ce-Type", tt.wantType)
			if v := s.header.Values("X-Injected"); len(v) != 0 {
				t.Errorf("X-Injected = %q: a header value smuggled a header", v)
			}
		})
	}
}

func TestDeliverAttemptHeaders(t *testing.T) {
	deadline := time.Date(2030, 1, 2, 4, 4, 5, 678_900_000, time.FixedZone("CET", 3600))
	tests := []struct {
		name   string
		req    func(r *Request)
		want   map[string]string
		absent []string
	}{
		{
			name: "first attempt",
			req: func(r *Request) {
				r.Attempt = 1
				r.Deadline = deadline
			},
			want: map[string]string{
				"Handoff-Attempt":     "1",
				"Handoff-Deadline":    "2030-01-02T03:04:05.678Z",
				"Handoff-Redelivered": "false",
			},
			absent: []string{"Handoff-Replay-Id"},
		},
		{
			name: "redelivered replay",
			req: func(r *Request) {
				r.Attempt = 7
				r.Deadline = time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)
				r.Redelivered = true
				r.ReplayID = "replay-2030-05-06"
			},
			want: map[string]string{
				"Handoff-Attempt":     "7",
				"Handoff-Deadline":    "2030-05-06T07:08:09.000Z",
				"Handoff-Redelivered": "true",
				"Handoff-Replay-Id":   "replay-2030-05-06",
			},
		},
		{
			name: "no deadline",
			req:  func(r *Request) { r.Attempt = 2 },
			want: map[string]string{
				"Handoff-Attempt":     "2",
				"Handoff-Redelivered": "false",
			},
			absent: []string{"Handoff-Deadline", "Handoff-Replay-Id"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request(&broker.Message{Body: []byte("{}")})
			tt.req(r)
			s := deliverOnce(t, r)
			for k, v := range tt.want {
				wantHeader(t, s.header, k, v)
			}
			for _, k := range tt.absent {
				if v := s.header.Values(k); len(v) != 0 {
					t.Errorf("%s = %q, want none", k, v)
				}
			}
			if v := s.header.Get("Handoff-Deadline"); v != "" {
				if _, err := time.Parse(time.RFC3339, v); err != nil {
					t.Errorf("Handoff-Deadline %q is not RFC 3339: %v", v, err)
				}
			}
		})
	}
}

func TestDeliverMessageHeaders(t *testing.T) {
	tests := []struct {
		name    string
		headers broker.Headers
		req     func(r *Request)
		// want are headers the app must see with exactly this value.
		want map[string]string
		// absent are headers the app must not see at all.
		absent []string
	}{
		{
			name:    "application headers pass",
			headers: broker.Headers{"X-Tenant": "acme", "x-request-id": "r-1", "Authorization": "Bearer t"},
			want:    map[string]string{"X-Tenant": "acme", "X-Request-Id": "r-1", "Authorization": "Bearer t"},
		},
		{
			name:    "trace context passes",
			headers: broker.Headers{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "congo=t61rcWkgMzE"},
			want:    map[string]string{"Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "Tracestate": "congo=t61rcWkgMzE"},
		},
		{
			name:    "values keep tabs, spaces and UTF-8",
			headers: broker.Headers{"X-Tab": "a\tb", "X-Space": "a b  c", "X-Utf8": "café ✓", "X-Empty": ""},
			want:    map[string]string{"X-Tab": "a\tb", "X-Space": "a b  c", "X-Utf8": "café ✓", "X-Empty": ""},
		},
		{
			name: "handoff- headers are the sidecar's, in any case",
			headers: broker.Headers{
				"handoff-attempt":     "99",
				"HANDOFF-DEADLINE":    "2000-01-01T00:00:00.000Z",
				"Handoff-Redelivered": "true",
				"handoff-replay-id":   "forged",
				"handoff-error":       "boom",
				"HaNdOfF-Event-Id":    "forged-id",
				"X-Kept":              "yes",
			},
			want: map[string]string{
				"Handoff-Attempt":     "1",
				"Handoff-Redelivered": "false",
				"X-Kept":              "yes",
			},
			absent: []string{"Handoff-Deadline", "Handoff-Replay-Id", "Handoff-Error", "Handoff-Event-Id"},
		},
		{
			name:    "handoff- headers do not displace a real replay id",
			headers: broker.Headers{"handoff-replay-id": "forged"},
			req:     func(r *Request) { r.ReplayID = "real" },
			want:    map[string]string{"Handoff-Replay-Id": "real"},
		},
		{
			name: "hop-by-hop and transport headers are not passed",
			headers: broker.Headers{
				"Connection":        "close",
				"Keep-Alive":        "timeout=1",
				"Upgrade":           "h2c",
				"TE":                "trailers",
				"Trailer":           "X-Checksum",
				"Expect":            "100-continue",
				"Proxy-Connection":  "keep-alive",
				"X-Kept":            "yes",
				"Transfer-Encoding": "chunked",
			},
			want:   map[string]string{"X-Kept": "yes"},
			absent: []string{"Connection", "Keep-Alive", "Upgrade", "Te", "Trailer", "Expect", "Proxy-Connection", "Transfer-Encoding"},
		},
		{
			name:    "proxy credentials are not passed",
			headers: broker.Headers{"Proxy-Authorization": "Basic c2VjcmV0", "proxy-authenticate": "x", "Proxy-Anything": "y"},
			absent:  []string{"Proxy-Authorization", "Proxy-Authenticate", "Proxy-Anything"},
		},
		{
			name:    "message content-type header does not replace the content type",
			headers: broker.Headers{"content-type": "text/evil"},
			absent:  []string{"Content-Type"},
		},
		{
			name:    "values with control characters are dropped",
			headers: broker.Headers{"X-Crlf": "a\r\nX-Injected: 1", "X-Lf": "a\nb", "X-Cr": "a\rb", "X-Nul": "a\x00b", "X-Del": "a\x7fb", "X-Esc": "\x1b[31m", "X-Ok": "fine"},
			want:    map[string]string{"X-Ok": "fine"},
			absent:  []string{"X-Crlf", "X-Lf", "X-Cr", "X-Nul", "X-Del", "X-Esc", "X-Injected"},
		},
		{
			name:    "names that are not HTTP tokens are dropped",
			headers: broker.Headers{"X Space": "v", "X:Colon": "v", "X(Paren)": "v", "": "v", "Ünï": "v", "X\r\nInjected": "v", "X-Ok": "fine"},
			want:    map[string]string{"X-Ok": "fine"},
			absent:  []string{"Injected", "X-Injected"},
		},
		{
			name:    "other CloudEvents attributes pass in the HTTP spelling",
			headers: broker.Headers{"ce-subject": "order-7", "ce_time": "2025-06-01T12:00:00Z", "cloudEvents:dataschema": "https://schema/x", "cloudEvents_partitionkey": "k1", "CE-TraceParent": "tp"},
			want:    map[string]string{"Ce-Subject": "order-7", "Ce-Time": "2025-06-01T12:00:00Z", "Ce-Dataschema": "https://schema/x", "Ce-Partitionkey": "k1", "Ce-Traceparent": "tp"},
			absent:  []string{"Ce_time", "Cloudevents:dataschema", "Cloudevents_partitionkey"},
		},
		{
			name:    "CloudEvents attribute values with control characters are dropped",
			headers: broker.Headers{"ce_subject": "a\r\nb", "ce-time": "ok"},
			want:    map[string]string{"Ce-Time": "ok"},
			absent:  []string{"Ce-Subject"},
		},
		{
			name:    "bare binding prefixes are ordinary names",
			headers: broker.Headers{"ce-": "x", "ce_": "y"},
			want:    map[string]string{"Ce-": "x", "Ce_": "y"},
		},
		{
			// An attribute name that is no HTTP token cannot be sent; like
			// any other bad header it must be left out, not fail the call.
			name:    "CloudEvents attribute names that are not HTTP tokens are dropped",
			headers: broker.Headers{"ce_bad name": "v", "cloudEvents:a/b": "v", "ce-time": "ok"},
			want:    map[string]string{"Ce-Time": "ok"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(`{"id":1}`)
			r := request(&broker.Message{Body: body, Headers: tt.headers})
			if tt.req != nil {
				tt.req(r)
			}
			s := deliverOnce(t, r)
			for k, v := range tt.want {
				wantHeader(t, s.header, k, v)
			}
			for _, k := range tt.absent {
				if v := s.header.Values(k); len(v) != 0 {
					t.Errorf("%s = %q, want none", k, v)
				}
			}
			// Whatever the message said, the transport framing is the
			// sidecar's.
			if !strings.HasPrefix(s.host, "127.0.0.1:") {
				t.Errorf("Host = %q, want the app's loopback address", s.host)
			}
			if string(s.body) != string(body) || s.contentLength != int64(len(body)) || s.chunked {
				t.Errorf("body %q, content-length %d, chunked %v; want %q, %d, unchunked", s.body, s.contentLength, s.chunked, body, len(body))
			}
			wantHeader(t, s.header, "Ce-Id", r.EventID)
			wantHeader(t, s.header, "Ce-Specversion", SpecVersion)
		})
	}
}

func TestDeliverReservedHostAndLength(t *testing.T) {
	tests := []struct {
		name    string
		headers broker.Headers
	}{
		{"host", broker.Headers{"Host": "evil.example"}},
		{"host lower case", broker.Headers{"host": "evil.example"}},
		{"content-length too short", broker.Headers{"Content-Length": "1"}},
		{"content-length too long", broker.Headers{"content-length": "99999"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte("0123456789")
			s := deliverOnce(t, request(&broker.Message{Body: body, Headers: tt.headers}))
			if !strings.HasPrefix(s.host, "127.0.0.1:") {
				t.Errorf("Host = %q, want the app's loopback address", s.host)
			}
			if string(s.body) != string(body) || s.contentLength != int64(len(body)) {
				t.Errorf("body %q with content-length %d, want %q with %d", s.body, s.contentLength, body, len(body))
			}
		})
	}
}

func TestCEAttribute(t *testing.T) {
	tests := []struct {
		name   string
		key    string
		want   string
		wantOK bool
	}{
		{"http spelling", "ce-source", "source", true},
		{"kafka spelling", "ce_source", "source", true},
		{"amqp colon spelling", "cloudEvents:source", "source", true},
		{"amqp underscore spelling", "cloudEvents_source", "source", true},
		{"upper case", "CE-TYPE", "type", true},
		{"mixed case amqp", "CloudEvents:Id", "id", true},
		{"extension", "ce-partitionkey", "partitionkey", true},
		{"prefix alone", "ce-", "", false},
		{"amqp prefix alone", "cloudEvents:", "", false},
		{"ordinary header", "traceparent", "", false},
		{"prefix inside the name", "x-ce-source", "", false},
		{"no separator", "cesource", "", false},
		{"dot separator", "ce.source", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ceAttribute(tt.key)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ceAttribute(%q) = %q, %v; want %q, %v", tt.key, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// FuzzSetHeaders feeds arbitrary message headers through setHeaders and checks
// that everything it writes could be sent, and that the sidecar's own
// attributes are never displaced.
func FuzzSetHeaders(f *testing.F) {
	seeds := [][2]string{
		{"X-Tenant", "acme"},
		{"ce-source", "/orders"},
		{"ce_id", "forged"},
		{"cloudEvents:specversion", "0.3"},
		{"cloudEvents_type", "t"},
		{"handoff-attempt", "99"},
		{"HANDOFF-replay-id", "x"},
		{"Host", "evil"},
		{"Content-Length", "1"},
		{"Proxy-Authorization", "secret"},
		{"X-Crlf", "a\r\nb"},
		{"X Bad", "v"},
		{"ce-bad name", "v"},
		{"cloudEvents:a:b", "v"},
		{"ce-", "v"},
		{"", ""},
		{"Ünï", "ü"},
		{"X-Del", "\x7f"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		r := &Request{
			Message: &broker.Message{Headers: broker.Headers{k: v}},
			EventID: "evt", Source: "src", Type: "typ", Attempt: 3,
		}
		h := http.Header{}
		setHeaders(h, r)
		for name, vals := range h {
			if !isToken(name) {
				t.Errorf("header name %q is not an HTTP token", name)
			}
			if len(vals) != 1 {
				t.Errorf("header %q has %d values, want 1", name, len(vals))
			}
			for _, val := range vals {
				if !validValue(val) {
					t.Errorf("header %q has value %q with control characters", name, val)
				}
			}
			if reserved[name] && name != "Content-Type" {
				t.Errorf("reserved header %q written", name)
			}
		}
		for name, want := range map[string]string{"Ce-Id": "evt", "Ce-Specversion": SpecVersion, "Handoff-Attempt": "3", "Handoff-Redelivered": "false"} {
			if got := h.Get(name); got != want {
				t.Errorf("%s = %q, want %q", name, got, want)
			}
		}
		for _, name := range []string{"Handoff-Replay-Id", "Handoff-Deadline", "Content-Type"} {
			if _, ok := h[name]; ok {
				t.Errorf("%s written though the request has none", name)
			}
		}
	})
}

// isToken is RFC 9110's token rule, written out independently of validName.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// Two message headers that name one request header send one value, the
// same on every attempt whatever the map order: the smaller.
func TestSetHeadersSpellingsOfOneName(t *testing.T) {
	r := &Request{
		Message: &broker.Message{Headers: broker.Headers{
			"ce-tenant": "b", "ce_tenant": "a", "cloudEvents:tenant": "c", "x-a": "2", "X-A": "1",
		}},
		EventID: "e", Source: "/s", Type: "t", Attempt: 1,
	}
	for range 50 {
		h := http.Header{}
		setHeaders(h, r)
		if got := h["Ce-Tenant"]; len(got) != 1 || got[0] != "a" {
			t.Fatalf("Ce-Tenant = %q, want [a]", got)
		}
		if got := h["X-A"]; len(got) != 1 || got[0] != "1" {
			t.Fatalf("X-A = %q, want [1]", got)
		}
	}
}

// setHeaders puts the headers appendHeaders makes for r in h, for tests
// that read them as a request's.
func setHeaders(h http.Header, r *Request) {
	var f fields
	appendHeaders(&f, r)
	for _, x := range f {
		h[x.name] = []string{x.value}
	}
}

// validName agrees with the token rule on every byte.
func TestValidNameEveryByte(t *testing.T) {
	for c := range 256 {
		s := "X" + string([]byte{byte(c)}) + "y"
		if validName(s) != isToken(s) {
			t.Errorf("validName(%q) = %v, the token rule says %v", s, validName(s), isToken(s))
		}
	}
}
