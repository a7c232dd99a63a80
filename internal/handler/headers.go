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
				h[http.CanonicalHeaderKey("ce-"+attr)] = []string{v}
			}
			continue
		}
		name := http.CanonicalHeaderKey(k)
		if !validName(k) || reserved[name] || strings.HasPrefix(name, "Proxy-") {
			continue
		}
		h[name] = []string{v}
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
	h["Ce-Id"] = []string{r.EventID}
	h["Ce-Specversion"] = []string{SpecVersion}
	h["Ce-Source"] = []string{ceSource}
	h["Ce-Type"] = []string{ceType}
	if contentType != "" {
		h["Content-Type"] = []string{contentType}
	}
	h["Handoff-Attempt"] = []string{strconv.Itoa(r.Attempt)}
	if !r.Deadline.IsZero() {
		h["Handoff-Deadline"] = []string{r.Deadline.UTC().Format(broker.TimeLayout)}
	}
	h["Handoff-Redelivered"] = []string{strconv.FormatBool(r.Redelivered)}
	if r.ReplayID != "" {
		h["Handoff-Replay-Id"] = []string{r.ReplayID}
	}
}

// ceAttribute recognises a CloudEvents attribute carried as a message header
// in any of the protocol bindings' spellings: ce-x (HTTP), ce_x (Kafka),
// cloudEvents:x or cloudEvents_x (AMQP).
func ceAttribute(k string) (string, bool) {
	lk := strings.ToLower(k)
	for _, p := range []string{"ce-", "ce_", "cloudevents:", "cloudevents_"} {
		if strings.HasPrefix(lk, p) && len(lk) > len(p) {
			return lk[len(p):], true
		}
	}
	return "", false
}

// validName reports whether k is an HTTP token (RFC 9110 §5.6.2).
func validName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c >= 0x80 || c <= ' ' || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
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
