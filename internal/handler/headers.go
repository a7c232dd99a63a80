package handler

import (
	"net/http"
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

// setHeaders writes the CloudEvents attributes, the Handoff-* attempt headers
// and the message's own headers onto an HTTP request.
func setHeaders(h http.Header, r *Request) {
	m := r.Message
	var ceSource, ceType string
	contentType := m.ContentType
	// One array backs every value the sidecar sets (each header holds a
	// one-element slice of it): an allocation per call, not per header.
	vals := make([]string, 0, 9+len(m.Headers))
	set := func(name, v string) {
		vals = append(vals, v)
		h[name] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	for k, v := range m.Headers {
		if broker.IsOwned(k) || !validValue(v) {
			continue
		}
		if attr, ok := ceAttribute(k); ok {
			switch {
			case attr == "id" || attr == "specversion":
				continue // the sidecar's event id and version win
			case attr == "source":
				ceSource = v
			case attr == "type":
				ceType = v
			case attr == "datacontenttype":
				// In binary mode this attribute is the Content-Type header.
				if contentType == "" {
					contentType = v
				}
			case validName(attr):
				set(http.CanonicalHeaderKey("ce-"+attr), v)
			}
			continue
		}
		name := http.CanonicalHeaderKey(k)
		if !validName(k) || reserved[name] || strings.HasPrefix(name, "Proxy-") {
			continue
		}
		set(name, v)
	}
	if ceSource == "" {
		ceSource = r.Source
	}
	if ceType == "" {
		ceType = m.Type
	}
	if ceType == "" {
		ceType = r.Type
	}
	set("Ce-Id", r.EventID)
	set("Ce-Specversion", SpecVersion)
	set("Ce-Source", ceSource)
	set("Ce-Type", ceType)
	if contentType != "" {
		set("Content-Type", contentType)
	}
	set("Handoff-Attempt", strconv.Itoa(r.Attempt))
	if !r.Deadline.IsZero() {
		var buf [40]byte
		set("Handoff-Deadline", string(r.Deadline.UTC().AppendFormat(buf[:0], broker.TimeLayout)))
	}
	set("Handoff-Redelivered", strconv.FormatBool(r.Redelivered))
	if r.ReplayID != "" {
		set("Handoff-Replay-Id", r.ReplayID)
	}
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
		c := k[i]
		if c >= 0x7f || c <= ' ' || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

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
