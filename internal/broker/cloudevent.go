package broker

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// StructuredContentType is the content type of a message in the CloudEvents
// structured content mode with the JSON event format (the Kafka and AMQP
// protocol bindings): the body is the event, attributes and data together.
const StructuredContentType = "application/cloudevents+json"

// Event is the CloudEvent a structured-mode message carries, read from its
// body once, at intake. The message's body stays the envelope as received:
// retry and dead-letter copies carry it unchanged.
type Event struct {
	ID, Source, Type, SpecVersion string
	// DataContentType is the envelope's datacontenttype, empty when it has
	// none (its data, if JSON, is then application/json).
	DataContentType string
	// Attrs are the event's other attributes — subject, time, dataschema and
	// extensions — in name order, numbers and booleans as their JSON text.
	Attrs []Attr
	// Data is the event's data: the JSON value of the envelope's data member
	// when DataJSON, else the bytes it stands for (a string's text, or
	// data_base64 decoded). Nil when the event has none.
	Data     []byte
	DataJSON bool
}

// Attr is one CloudEvents attribute.
type Attr struct{ Name, Value string }

// ErrStructured is returned (wrapped) by ParseStructured when a body is not a
// CloudEvent in the JSON event format.
var ErrStructured = errors.New("not a structured CloudEvent")

// IsStructured reports whether a message's content type says its body is a
// structured-mode CloudEvent in JSON; parameters such as charset are allowed.
func IsStructured(contentType string) bool {
	// Every message passes here: the media type is compared in place,
	// without parsing (and allocating) the parameters, which do not change
	// what it is.
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(mt), StructuredContentType)
}

// requiredAttrs must be present, as non-empty strings, in every event.
var requiredAttrs = [...]string{"id", "source", "specversion", "type"}

// ParseStructured reads a CloudEvent in the CloudEvents JSON event format.
// It returns an error wrapping ErrStructured, which says what is wrong, when
// body is not JSON, is not an object, lacks a required attribute, has an
// attribute that is not a string, number or boolean or a string with a
// control character, carries both data and data_base64, or speaks a
// CloudEvents major version other than 1. A member whose value is null is
// absent.
func ParseStructured(body []byte) (*Event, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrStructured, err)
	}
	if members == nil {
		return nil, fmt.Errorf("%w: the body is not a JSON object", ErrStructured)
	}
	for k, v := range members {
		if isNull(v) {
			delete(members, k)
		}
	}
	e := &Event{}
	for _, name := range requiredAttrs {
		v, err := stringAttr(members, name)
		if err != nil {
			return nil, err
		}
		if v == "" {
			return nil, fmt.Errorf("%w: attribute %q is missing", ErrStructured, name)
		}
		switch name {
		case "id":
			e.ID = v
		case "source":
			e.Source = v
		case "specversion":
			e.SpecVersion = v
		case "type":
			e.Type = v
		}
	}
	if major, _, _ := strings.Cut(e.SpecVersion, "."); major != "1" {
		return nil, fmt.Errorf("%w: specversion %q is not supported (1.x is)", ErrStructured, e.SpecVersion)
	}
	ct, err := stringAttr(members, "datacontenttype")
	if err != nil {
		return nil, err
	}
	e.DataContentType = ct
	data, hasData := members["data"]
	b64, hasB64 := members["data_base64"]
	switch {
	case hasData && hasB64:
		return nil, fmt.Errorf("%w: both data and data_base64 are present", ErrStructured)
	case hasB64:
		var s string
		if err := json.Unmarshal(b64, &s); err != nil {
			return nil, fmt.Errorf("%w: data_base64 is not a string", ErrStructured)
		}
		if e.Data, err = base64.StdEncoding.DecodeString(s); err != nil {
			return nil, fmt.Errorf("%w: data_base64: %v", ErrStructured, err)
		}
	case hasData:
		e.Data, e.DataJSON = bytes.TrimSpace(data), true
		if ct != "" && !isJSONType(ct) && e.Data[0] == '"' {
			// Data that is not JSON travels as a JSON string: its text is
			// the data.
			var s string
			if err := json.Unmarshal(data, &s); err != nil {
				return nil, fmt.Errorf("%w: data: %v", ErrStructured, err)
			}
			e.Data, e.DataJSON = []byte(s), false
		}
	}
	for name, v := range members {
		switch name {
		case "id", "source", "specversion", "type", "datacontenttype", "data", "data_base64":
			continue
		}
		s, err := scalar(v)
		if err != nil {
			return nil, fmt.Errorf("%w: attribute %q: %v", ErrStructured, name, err)
		}
		e.Attrs = append(e.Attrs, Attr{Name: name, Value: s})
	}
	// In name order, not the map's: every delivery of the message is the same.
	slices.SortFunc(e.Attrs, func(a, b Attr) int { return strings.Compare(a.Name, b.Name) })
	return e, nil
}

// stringAttr returns the string attribute name, "" when it is absent.
func stringAttr(members map[string]json.RawMessage, name string) (string, error) {
	v, ok := members[name]
	if !ok {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("%w: attribute %q is not a string", ErrStructured, name)
	}
	if !allowedString(s) {
		return "", fmt.Errorf("%w: attribute %q holds a control character", ErrStructured, name)
	}
	return s, nil
}

// allowedString reports whether s is a CloudEvents String: no control
// characters (U+0000–U+001F, U+007F–U+009F). Besides being the type system's
// rule, it keeps every attribute sendable as an HTTP header or gRPC metadata:
// one that is not would fail every attempt of its event.
func allowedString(s string) bool {
	for _, r := range s {
		if r < 0x20 || r >= 0x7f && r <= 0x9f {
			return false
		}
	}
	return true
}

// scalar returns an attribute value as text: a string as it is, a number or
// boolean as its JSON text. Objects and arrays are not CloudEvents types.
func scalar(v json.RawMessage) (string, error) {
	v = bytes.TrimSpace(v)
	switch {
	case len(v) == 0:
		return "", errors.New("no value")
	case v[0] == '"':
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return "", err
		}
		if !allowedString(s) {
			return "", errors.New("holds a control character")
		}
		return s, nil
	case string(v) == "true" || string(v) == "false":
		return string(v), nil
	case v[0] == '-' || v[0] >= '0' && v[0] <= '9':
		return string(v), nil // json.Unmarshal checked it is a number
	}
	return "", errors.New("not a string, number or boolean")
}

func isNull(v json.RawMessage) bool {
	return string(bytes.TrimSpace(v)) == "null"
}

// isJSONType reports whether a content type declares JSON data: its subtype
// is json or ends in +json.
func isJSONType(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	_, sub, _ := strings.Cut(strings.ToLower(strings.TrimSpace(mt)), "/")
	return sub == "json" || strings.HasSuffix(sub, "+json")
}
