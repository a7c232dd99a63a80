package handler

import (
	"slices"
	"strings"
)

// The CloudEvents Distributed Tracing extension's attributes, named as W3C
// trace context names its headers.
const (
	attrTraceParent = "traceparent"
	attrTraceState  = "tracestate"
)

// eventTrace is the trace context an event of a batch carries as its
// Distributed Tracing extension: the attempt's span when there is one,
// else the message's own traceparent header, when it is a valid one, with
// its tracestate. A batch has no per-event headers or metadata, so this is
// the only way the app can hang its spans under the attempt. ok is false
// when there is neither: the event keeps whatever traceparent attribute the
// message has as a CloudEvents attribute.
//
// Two spellings of one header (traceparent and Traceparent): the smaller
// valid value, so that every attempt of a message sends the same.
func eventTrace(r *Request) (parent, state string, ok bool) {
	if r.TraceParent != "" {
		return r.TraceParent, r.TraceState, true
	}
	for k, v := range r.Message.Headers {
		if strings.EqualFold(k, attrTraceParent) && validTraceParent(v) && (parent == "" || v < parent) {
			parent = v
		}
	}
	if parent == "" {
		return "", "", false
	}
	for k, v := range r.Message.Headers {
		if strings.EqualFold(k, attrTraceState) && validTraceState(v) && (state == "" || v < state) {
			state = v
		}
	}
	return parent, state, true
}

// withTrace puts the trace context in ext in place of any the message
// carries as attributes: a tracestate belongs to its traceparent, never to
// another.
func withTrace(ext []attr, parent, state string) []attr {
	ext = slices.DeleteFunc(ext, func(a attr) bool { return a.name == attrTraceParent || a.name == attrTraceState })
	ext = append(ext, attr{attrTraceParent, parent})
	if state != "" {
		ext = append(ext, attr{attrTraceState, state})
	}
	return ext
}

// withTraceMap is withTrace for a gRPC event's extensions.
func withTraceMap(ext map[string]string, parent, state string) map[string]string {
	if ext == nil {
		ext = make(map[string]string, 2)
	}
	ext[attrTraceParent] = parent
	delete(ext, attrTraceState)
	if state != "" {
		ext[attrTraceState] = state
	}
	return ext
}

// validTraceParent reports whether v is a W3C traceparent the app's tracer
// can continue: version-traceid-parentid-flags in lower-case hex, neither id
// all zeros, version ff never; a later version may append fields.
func validTraceParent(v string) bool {
	const size = 55 // 2+1+32+1+16+1+2
	if len(v) < size || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return false
	}
	version := v[:2]
	if !lowerHex(version) || version == "ff" || (version == "00" && len(v) != size) || (len(v) > size && v[size] != '-') {
		return false
	}
	traceID, spanID, flags := v[3:35], v[36:52], v[53:55]
	return lowerHex(traceID) && lowerHex(spanID) && lowerHex(flags) &&
		strings.Trim(traceID, "0") != "" && strings.Trim(spanID, "0") != ""
}

// validTraceState reports whether v can travel as a tracestate: printable
// ASCII, as W3C allows it, so also a valid header, metadata and protobuf
// string. Its list members are the vendors' to read.
func validTraceState(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < ' ' || v[i] > '~' {
			return false
		}
	}
	return true
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
