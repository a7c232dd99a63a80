package handler

import (
	"slices"
	"strconv"
	"strings"

	"handoff.dev/handoff/internal/broker"
)

// SpecVersion is the CloudEvents version the sidecar speaks.
const SpecVersion = "1.0"

// reserved are request headers the transport or the sidecar owns; a message
// header of the same name is not passed to the app.
var reserved = map[string]bool{
	"Host": true, "Content-Length": true, "Content-Type": true, "Connection": true,
	"Transfer-Encoding": true, "Te": true, "Trailer": true, "Upgrade": true,
	"Keep-Alive": true, "Expect": true, "Proxy-Authorization": true, "Proxy-Connection": true,
}

// headerCap is at least how many headers appendHeaders adds for r, and as
// few as can be told without reading the headers twice: a call's fields are
// grown to it once.
func headerCap(r *Request) int {
	// Ce-Id, Ce-Specversion, Ce-Source, Ce-Type, Handoff-Attempt and
	// Handoff-Redelivered are always set.
	n := 6
	if !r.Deadline.IsZero() {
		n++
	}
	if r.ReplayID != "" {
		n++
	}
	if r.TraceParent != "" {
		n += 2 // Traceparent and Tracestate
	}
	m := r.Message
	if e := m.Event; e != nil {
		n += len(e.Attrs) + 1 // Content-Type
	} else if m.ContentType != "" {
		n++
	}
	// Each of the message's own headers sets at most one, a
	// datacontenttype attribute among them Content-Type.
	return n + len(m.Headers)
}

// field is one header of a request, its name canonical.
type field struct{ name, value string }

// fields are a request's headers, one value each, in the order set: a
// call's headers are a handful, so a look along them costs less than a
// map's hashing, and they are written out in that order.
type fields []field

// find is where name is, or -1.
func (f fields) find(name string) int {
	for i := range f {
		if f[i].name == name {
			return i
		}
	}
	return -1
}

// set sets name to v, in place of a value set before.
func (f *fields) set(name, v string) {
	if i := f.find(name); i >= 0 {
		(*f)[i].value = v
		return
	}
	*f = append(*f, field{name, v})
}

// setOnce is set for two message headers that name one request header (ce-x
// and ce_x, or x-a and X-A): the smaller value is kept, so that every attempt
// sends the same whatever the order they are read in.
func (f *fields) setOnce(name, v string) {
	if i := f.find(name); i >= 0 {
		(*f)[i].value = min((*f)[i].value, v)
		return
	}
	*f = append(*f, field{name, v})
}

// del removes name.
func (f *fields) del(name string) {
	if i := f.find(name); i >= 0 {
		*f = slices.Delete(*f, i, i+1)
	}
}

// appendHeaders adds the CloudEvents attributes, the Handoff-* attempt
// headers and the message's own headers of an HTTP request for r to f.
func appendHeaders(f *fields, r *Request) {
	*f = slices.Grow(*f, headerCap(r))
	ceSource, ceType, contentType := ceAttributes(r, func(attr, v string) {
		if validName(attr) {
			f.setOnce(attributeNames.canonical(attr), v)
		}
	}, func(k, v string) {
		if !validName(k) {
			return
		}
		if name := messageNames.canonical(k); !reserved[name] && !strings.HasPrefix(name, "Proxy-") {
			f.setOnce(name, v)
		}
	})
	f.set("Ce-Id", r.EventID)
	f.set("Ce-Specversion", SpecVersion)
	f.set("Ce-Source", ceSource)
	f.set("Ce-Type", ceType)
	if contentType != "" {
		f.set("Content-Type", contentType)
	}
	f.set("Handoff-Attempt", strconv.Itoa(r.Attempt))
	if !r.Deadline.IsZero() {
		var buf [40]byte
		f.set("Handoff-Deadline", string(appendTime(buf[:0], r.Deadline)))
	}
	f.set("Handoff-Redelivered", strconv.FormatBool(r.Redelivered))
	if r.ReplayID != "" {
		f.set("Handoff-Replay-Id", r.ReplayID)
	}
	if r.TraceParent != "" {
		// The attempt's span, child of the message's: the app's own spans
		// join the message's trace under it.
		f.set("Traceparent", r.TraceParent)
		f.del("Tracestate")
		if r.TraceState != "" {
			f.set("Tracestate", r.TraceState)
		}
	}
}

// ceAttributes is the one place that says which CloudEvents attributes a
// message has, for every transport and content mode: a structured-mode
// event's own (read at intake into Message.Event), else those among the
// message's headers, with source, type and datacontenttype resolved against
// the message and the route. id and specversion are the sidecar's own
// (Request.EventID is a structured event's id). ext gets every other
// attribute, other (when not nil) every header that is not an attribute.
// Headers the sidecar owns, and values no header can carry, are left out.
// The data that goes with the attributes is Message.Data.
func ceAttributes(r *Request, ext func(attr, v string), other func(k, v string)) (source, typ, contentType string) {
	m := r.Message
	if m.Event != nil {
		return eventAttributes(m, ext, other)
	}
	contentType = m.ContentType
	for k, v := range m.Headers {
		if broker.IsOwned(k) || !validValue(v) {
			continue
		}
		attr, ok := ceAttribute(k)
		switch {
		case !ok:
			if other != nil {
				other(k, v)
			}
		case attr == "id" || attr == "specversion":
			// The sidecar's event id and version win.
		case attr == "source":
			source = v
		case attr == "type":
			typ = v
		case attr == "datacontenttype":
			if contentType == "" {
				contentType = v
			}
		default:
			ext(attr, v)
		}
	}
	if source == "" {
		source = r.Source
	}
	if typ == "" {
		typ = m.Type
	}
	if typ == "" {
		typ = r.Type
	}
	return source, typ, contentType
}

// eventAttributes is ceAttributes for a structured-mode event: its attributes
// are in the event, and the message's headers that look like attributes are
// not (the bindings put none there in this mode) and are not passed on.
func eventAttributes(m *broker.Message, ext func(attr, v string), other func(k, v string)) (source, typ, contentType string) {
	e := m.Event
	for _, a := range e.Attrs {
		if validValue(a.Value) {
			ext(a.Name, a.Value)
		}
	}
	if other != nil {
		for k, v := range m.Headers {
			if _, isAttr := ceAttribute(k); !isAttr && !broker.IsOwned(k) && validValue(v) {
				other(k, v)
			}
		}
	}
	contentType = e.DataContentType
	if contentType == "" && e.DataJSON {
		// The JSON format's default: data without a datacontenttype is JSON.
		contentType = "application/json"
	}
	return e.Source, e.Type, contentType
}

// ceAttribute recognises a CloudEvents attribute carried as a message header
// in any of the protocol bindings' spellings: ce-x (HTTP), ce_x (Kafka),
// cloudEvents:x or cloudEvents_x (AMQP).
func ceAttribute(k string) (string, bool) {
	for _, p := range ceAttributePrefixes {
		if len(k) > len(p) && strings.EqualFold(k[:len(p)], p) {
			return strings.ToLower(k[len(p):]), true
		}
	}
	return "", false
}

var ceAttributePrefixes = [...]string{"ce-", "ce_", "cloudevents:", "cloudevents_"}

// validName reports whether k is an HTTP token (RFC 9110 §5.6.2).
func validName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if !tokenChar[k[i]] {
			return false
		}
	}
	return true
}

// tokenChar says which bytes a token may hold: every name of every call is
// checked, a byte at a time.
var tokenChar = func() (t [256]bool) {
	for c := '!'; c < 0x7f; c++ {
		t[c] = !strings.ContainsRune("\"(),/:;<=>?@[\\]{}", c)
	}
	return t
}()

// validValue reports whether v can be sent as a header value: no control
// characters except tab. A header that cannot be sent is left out rather than
// failing every attempt of its message.
func validValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
