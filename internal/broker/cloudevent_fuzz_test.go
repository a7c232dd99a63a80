package broker_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"handoff.dev/handoff/internal/broker"
)

func FuzzStructuredEvent(f *testing.F) {
	for _, s := range []string{
		`{"id":"1","source":"s","type":"t","specversion":"1.0"}`,
		`{"id":"1","source":"s","type":"t","specversion":"1.0","datacontenttype":"application/json","data":{"a":[1,2,{"b":null}]}}`,
		`{"id":"1","source":"s","type":"t","specversion":"1.0","datacontenttype":"text/plain","data":"line\n\u0000\ud83d\ude00"}`,
		`{"id":"1","source":"s","type":"t","specversion":"1.0","datacontenttype":"text/plain","data":42}`,
		`{"id":"1","source":"s","type":"t","specversion":"1.0","data_base64":"AAEC/w=="}`,
		`{"id":"1","source":"s","type":"t","specversion":"1.0","data_base64":"AAEC/w"}`,
		`{"id":"1","source":"s","type":"t","specversion":"1.0","data_base64":""}`,
		`{"id":"1","source":"s","type":"t","specversion":"1.0","data":null,"data_base64":"AA=="}`,
		`{"id":"1","source":"s","type":"t","specversion":"1.0","data":1,"data_base64":"AA=="}`,
		`{"id":"1","id":"2","source":"s","type":"t","specversion":"1.0"}`,
		`{"id":"1","source":"s","type":"t","specversion":"1.0","x":1e999,"y":-0,"z":false}`,
		`{"id":"1","source":"s","type":"t","specversion":"1.0","Bad-Name":"v","":"e"}`,
		`{"id":"\u0000","source":"s\r\n","type":"t","specversion":"1"}`,
		`{"id":"1","source":"s","type":"t","specversion":"10.0"}`,
		`{"id":"1","source":"s","type":"t","specversion":"0.3"}`,
		`{"id":"1","source":"s","type":"t"}`,
		` {"id":"1","source":"s","type":"t","specversion":"1.0"} `,
		`{"id":"1","source":"s","type":"t","specversion":"1.0"}{}`,
		`[]`, `null`, `""`, `{}`, `{`, "\xff\xfe", ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		e, err := broker.ParseStructured(body)
		if !bytes.Equal(body, orig) {
			t.Fatal("ParseStructured changed its input")
		}
		again, err2 := broker.ParseStructured(body)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %v then %v", err, err2)
		}
		if err != nil {
			if e != nil {
				t.Fatalf("an error and an event: %v, %+v", err, e)
			}
			if !errors.Is(err, broker.ErrStructured) {
				t.Fatalf("error %v does not wrap ErrStructured", err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if e.ID == "" || e.Source == "" || e.Type == "" || !strings.HasPrefix(e.SpecVersion, "1") {
			t.Fatalf("accepted an event without its required attributes: %+v", e)
		}
		for _, v := range append([]string{e.ID, e.Source, e.Type, e.SpecVersion, e.DataContentType}, attrValues(e.Attrs)...) {
			for _, r := range v {
				if r < 0x20 || r >= 0x7f && r <= 0x9f {
					t.Fatalf("attribute value %q holds a control character", v)
				}
			}
		}
		if e.DataJSON && !json.Valid(e.Data) {
			t.Fatalf("DataJSON but data %q is not JSON", e.Data)
		}
		if !slices.IsSortedFunc(e.Attrs, func(a, b broker.Attr) int { return strings.Compare(a.Name, b.Name) }) {
			t.Fatalf("attributes not in name order: %v", e.Attrs)
		}
		for _, a := range e.Attrs {
			switch a.Name {
			case "id", "source", "type", "specversion", "datacontenttype", "data", "data_base64":
				t.Fatalf("attribute %q is in Attrs", a.Name)
			}
		}
		if !slices.Equal(e.Attrs, again.Attrs) || !bytes.Equal(e.Data, again.Data) || e.ID != again.ID {
			t.Fatalf("not deterministic: %+v then %+v", e, again)
		}
		// A message that labels it structured has it as its event; its body,
		// which copies carry, is untouched.
		m := &broker.Message{Body: body, ContentType: broker.StructuredContentType, Event: e}
		if !bytes.Equal(m.Body, orig) || !bytes.Equal(m.Data(), e.Data) {
			t.Fatal("Message.Data does not return the event's data")
		}
		// The event written back in the JSON format reads the same.
		round := map[string]any{"id": e.ID, "source": e.Source, "type": e.Type, "specversion": e.SpecVersion}
		if e.DataContentType != "" {
			round["datacontenttype"] = e.DataContentType
		}
		for _, a := range e.Attrs {
			round[a.Name] = a.Value
		}
		switch {
		case e.DataJSON:
			round["data"] = json.RawMessage(e.Data)
		case e.Data != nil && utf8.Valid(e.Data) && e.DataContentType != "" && !strings.Contains(strings.ToLower(e.DataContentType), "json"):
			round["data"] = string(e.Data)
		case e.Data != nil:
			round["data_base64"] = base64.StdEncoding.EncodeToString(e.Data)
		}
		b, err := json.Marshal(round)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		back, err := broker.ParseStructured(b)
		if err != nil {
			t.Fatalf("the event written back does not parse: %v\n%s", err, b)
		}
		if back.ID != e.ID || back.Source != e.Source || back.Type != e.Type || !slices.Equal(back.Attrs, e.Attrs) {
			t.Fatalf("round trip changed the attributes: %+v, then %+v", e, back)
		}
		if !bytes.Equal(back.Data, e.Data) && !(e.DataJSON && jsonEqual(back.Data, e.Data)) {
			t.Fatalf("round trip changed the data: %q, then %q", e.Data, back.Data)
		}
	})
}

func jsonEqual(a, b []byte) bool {
	var x, y bytes.Buffer
	return json.Compact(&x, a) == nil && json.Compact(&y, b) == nil && bytes.Equal(x.Bytes(), y.Bytes())
}

func attrValues(attrs []broker.Attr) []string {
	out := make([]string, len(attrs))
	for i, a := range attrs {
		out[i] = a.Value
	}
	return out
}
