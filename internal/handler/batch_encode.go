package handler

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/segmentio/asm/base64"
)

// The batched-mode request body: the batch's CloudEvents in JSON, written
// straight into a pooled buffer.

// event is one structured-mode CloudEvent of a batch. Its extension
// attributes from the message's headers, which have no field, and its JSON
// data, checked already and copied as it is (encoding/json would check it
// again and compact it), are written after the fields by encodeBatch.
type event struct {
	SpecVersion        string `json:"specversion"`
	ID                 string `json:"id"`
	Source             string `json:"source"`
	Type               string `json:"type"`
	DataContentType    string `json:"datacontenttype,omitempty"`
	HandoffAttempt     string `json:"handoffattempt"`
	HandoffDeadline    string `json:"handoffdeadline,omitempty"`
	HandoffRedelivered string `json:"handoffredelivered"`
	HandoffReplayID    string `json:"handoffreplayid,omitempty"`
	DataBase64         []byte `json:"data_base64,omitempty"` // written in base64 (appendBase64)
	data               []byte // JSON
	ext                []attr // in name order
}

// attr is an extension attribute.
type attr struct{ name, value string }

// fieldAttrs are the attributes event has fields for: an extension of the
// same name is not written, the sidecar's own value wins.
var fieldAttrs = map[string]bool{
	"specversion": true, "id": true, "source": true, "type": true, "datacontenttype": true,
	"handoffattempt": true, "handoffdeadline": true, "handoffredelivered": true, "handoffreplayid": true,
	"data": true, "data_base64": true,
}

// batchBufs are batch request bodies, reused: a batch of 64 events of 1 KiB
// is some 90 KB, written to the connection and done with once the call
// returns.
var batchBufs sync.Pool

func getBatchBuf() []byte {
	if b, ok := batchBufs.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return nil
}

// putBatchBuf keeps buf for the next batch, unless it is one of the rare
// large ones (a batch of large messages), which would pin its memory.
func putBatchBuf(buf []byte) {
	if cap(buf) > maxPooledBatch {
		return
	}
	batchBufs.Put(&buf)
}

// maxPooledBatch is the largest batch body kept for reuse.
const maxPooledBatch = 1 << 20

// encodeBatch writes the attempts as a JSON array of structured events, in
// the bytes encoding/json would write for event (with HTML left unescaped),
// the extensions after the fields and the JSON data last.
func encodeBatch(reqs []*Request) []byte { return appendBatch(nil, reqs) }

// appendBatch is encodeBatch, appended to buf.
func appendBatch(buf []byte, reqs []*Request) []byte {
	size := 2
	for _, r := range reqs {
		size += 4*len(r.Message.Body)/3 + 512
	}
	buf = slices.Grow(buf, size)
	buf = append(buf, '[')
	for i, r := range reqs {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendEvent(buf, structured(r))
	}
	return append(buf, ']')
}

// appendEvent appends e as one JSON object.
func appendEvent(buf []byte, e event) []byte {
	field := func(buf []byte, name, v string, omitEmpty bool) []byte {
		if omitEmpty && v == "" {
			return buf
		}
		if len(buf) > 0 && buf[len(buf)-1] != '{' {
			buf = append(buf, ',')
		}
		buf = append(buf, '"')
		buf = append(buf, name...) // a constant or validAttr: nothing to escape
		buf = append(buf, '"', ':')
		return appendJSONString(buf, v)
	}
	buf = append(buf, '{')
	buf = field(buf, "specversion", e.SpecVersion, false)
	buf = field(buf, "id", e.ID, false)
	buf = field(buf, "source", e.Source, false)
	buf = field(buf, "type", e.Type, false)
	buf = field(buf, "datacontenttype", e.DataContentType, true)
	buf = field(buf, "handoffattempt", e.HandoffAttempt, false)
	buf = field(buf, "handoffdeadline", e.HandoffDeadline, true)
	buf = field(buf, "handoffredelivered", e.HandoffRedelivered, false)
	buf = field(buf, "handoffreplayid", e.HandoffReplayID, true)
	if len(e.DataBase64) > 0 {
		buf = append(buf, `,"data_base64":"`...)
		buf = appendBase64(buf, e.DataBase64)
		buf = append(buf, '"')
	}
	for _, a := range e.ext {
		buf = field(buf, a.name, a.value, false)
	}
	if e.data != nil {
		buf = append(buf, `,"data":`...)
		buf = append(buf, e.data...)
	}
	return append(buf, '}')
}

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it with HTML escaping off: quote, backslash and control bytes,
// invalid UTF-8 as U+FFFD, and U+2028 and U+2029 (which JavaScript reads as
// line ends).
func appendJSONString(buf []byte, s string) []byte {
	const hex = "0123456789abcdef"
	buf = append(buf, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			buf = append(buf, s[start:i]...)
			switch b {
			case '\\', '"':
				buf = append(buf, '\\', b)
			case '\b':
				buf = append(buf, '\\', 'b')
			case '\f':
				buf = append(buf, '\\', 'f')
			case '\n':
				buf = append(buf, '\\', 'n')
			case '\r':
				buf = append(buf, '\\', 'r')
			case '\t':
				buf = append(buf, '\\', 't')
			default:
				buf = append(buf, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			buf = append(buf, s[start:i]...)
			buf = append(buf, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			buf = append(buf, s[start:i]...)
			buf = append(buf, '\\', 'u', '2', '0', '2', hex[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	buf = append(buf, s[start:]...)
	return append(buf, '"')
}

// structured builds r's event in structured mode: the same attributes as the
// binary-mode headers (Handoff-* as handoff* extensions), the body as data
// when it is JSON, else as data_base64. Message headers that are not
// CloudEvents attributes have no place in structured mode and are left out,
// but for the trace context, which the event carries as its traceparent and
// tracestate extensions (eventTrace).
func structured(r *Request) event {
	m := r.Message
	e := event{SpecVersion: SpecVersion, ID: wireID(r.EventID)}
	e.Source, e.Type, e.DataContentType = ceAttributes(r, func(name, v string) {
		if fieldAttrs[name] || !validAttr(name) {
			return
		}
		for i := range e.ext {
			if e.ext[i].name == name {
				// Two spellings of one attribute (ce-x and ce_x): the
				// smaller value, so that every attempt sends the same.
				e.ext[i].value = min(e.ext[i].value, v)
				return
			}
		}
		e.ext = append(e.ext, attr{name, v})
	}, nil)
	if parent, state, ok := eventTrace(r); ok {
		e.ext = withTrace(e.ext, parent, state)
	}
	// In name order, not the headers' map order: every attempt of a message
	// sends the same bytes.
	slices.SortFunc(e.ext, func(a, b attr) int { return strings.Compare(a.name, b.name) })
	if data := m.Data(); m.Event != nil && m.Event.DataJSON || isJSON(e.DataContentType) && json.Valid(data) {
		e.data = data
	} else if len(data) > 0 {
		e.DataBase64 = data
	}
	e.HandoffAttempt = strconv.Itoa(r.Attempt)
	if !r.Deadline.IsZero() {
		var buf [40]byte
		e.HandoffDeadline = string(appendTime(buf[:0], r.Deadline))
	}
	e.HandoffRedelivered = strconv.FormatBool(r.Redelivered)
	e.HandoffReplayID = r.ReplayID
	return e
}

// validAttr reports whether a is a CloudEvents attribute name: lower-case
// letters and digits.
func validAttr(a string) bool {
	if a == "" || len(a) > 64 {
		return false
	}
	for i := 0; i < len(a); i++ {
		if c := a[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// appendBase64 appends data in standard base64. In a batch of binary
// bodies the encoding is a good part of the sidecar's work, and the
// vectorised encoder does it in about a quarter of the standard library's
// time (BenchmarkEncodeBatch), with the same output.
func appendBase64(buf, data []byte) []byte {
	n := base64.StdEncoding.EncodedLen(len(data))
	buf = slices.Grow(buf, n)
	base64.StdEncoding.Encode(buf[len(buf):len(buf)+n], data)
	return buf[:len(buf)+n]
}

func isJSON(contentType string) bool {
	ct, _, _ := strings.Cut(contentType, ";")
	ct = strings.ToLower(strings.TrimSpace(ct))
	return ct == "application/json" || strings.HasSuffix(ct, "+json")
}

// wireID is an event id as a batch carries it: JSON and protobuf strings
// are UTF-8, so each run of invalid bytes becomes U+FFFD. A batch keeps its
// ids unique by it and matches answers by it: two ids that differ only in
// invalid bytes look alike to the app, and one answer must not settle both.
func wireID(id string) string {
	if utf8.ValidString(id) {
		return id
	}
	return strings.ToValidUTF8(id, "\uFFFD")
}
