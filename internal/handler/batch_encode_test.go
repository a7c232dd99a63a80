package handler

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// reflectEncode is how an event was written with encoding/json: the fields
// through the struct's tags, then the extensions and the JSON data. The
// hand-written encoder must write the same bytes.
func reflectEncode(t testing.TB, e event) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&e); err != nil {
		t.Fatal(err)
	}
	buf.Truncate(buf.Len() - 2) // the closing brace and Encode's newline
	for _, a := range e.ext {
		buf.WriteString(`,"` + a.name + `":`)
		if err := enc.Encode(a.value); err != nil {
			t.Fatal(err)
		}
		buf.Truncate(buf.Len() - 1)
	}
	if e.data != nil {
		buf.WriteString(`,"data":`)
		buf.Write(e.data)
	}
	buf.WriteByte('}')
	return buf.Bytes()
}

func checkEncodesLikeJSON(t *testing.T, r *Request) {
	t.Helper()
	e := structured(r)
	want := reflectEncode(t, e)
	got := appendEvent(nil, e)
	if !bytes.Equal(got, want) {
		t.Fatalf("appendEvent:\n got %q\nwant %q", got, want)
	}
	if !json.Valid(encodeBatch([]*Request{r, r})) {
		t.Fatalf("encodeBatch of %q is not JSON", got)
	}
}

func TestEncodeBatchWritesWhatEncodingJSONWrites(t *testing.T) {
	tricky := []string{"", "plain", `quote " and \ back`, "\x00\x01\x1f\b\f\n\r\t", "<html>&amp;</html>",
		"bad \xff utf8 \xc3", "line\u2028para\u2029", "é日本🎉", strings.Repeat("x", 300)}
	for _, s := range tricky {
		for _, ct := range []string{"", "application/json", "text/plain"} {
			body := []byte(s)
			if ct == "application/json" {
				body = []byte(`{"v":` + string(mustJSON(t, s)) + `}`)
			}
			r := &Request{
				Message: &broker.Message{ContentType: ct, Body: body,
					Headers: broker.Headers{"ce_traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "ce_custom": s, "ce-zeta": s}},
				EventID: s, Source: s, Type: s, Attempt: 3, ReplayID: s, Redelivered: s != "",
			}
			if s != "" {
				r.Deadline = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
			}
			checkEncodesLikeJSON(t, r)
		}
	}
}

// The vectorised base64 encoder works in blocks: every length up to a few
// blocks past the first, with every byte value, is written as encoding/json
// writes it.
func TestEncodeBatchBase64EveryLength(t *testing.T) {
	body := make([]byte, 300)
	for i := range body {
		body[i] = byte(i*151 + 7)
	}
	for n := range len(body) + 1 {
		checkEncodesLikeJSON(t, &Request{Message: &broker.Message{Body: body[:n]}, EventID: "e", Source: "/s", Type: "t", Attempt: 1})
	}
}

func FuzzEncodeBatch(f *testing.F) {
	f.Add("order-1", "/src", "a.b", "x", []byte(`{"a":1}`), "application/json")
	f.Add("\xff\u2028", "\x00", "<&>", "\"\\", []byte{0, 1, 2}, "")
	f.Fuzz(func(t *testing.T, id, source, typ, ext string, body []byte, ct string) {
		r := &Request{
			Message: &broker.Message{ContentType: ct, Body: body, Headers: broker.Headers{"ce_ext": ext}},
			EventID: id, Source: source, Type: typ, Attempt: 1, ReplayID: ext,
		}
		checkEncodesLikeJSON(t, r)
	})
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
