package broker_test

import (
	"errors"
	"slices"
	"testing"

	"handoff.dev/handoff/internal/broker"
)

func TestIsStructured(t *testing.T) {
	tests := []struct {
		name, ct string
		want     bool
	}{
		{"plain", "application/cloudevents+json", true},
		{"charset", "application/cloudevents+json; charset=utf-8", true},
		{"case and spaces", " Application/CloudEvents+JSON ;charset=UTF-8", true},
		{"bad parameter", "application/cloudevents+json; charset", true},
		{"empty", "", false},
		{"json", "application/json", false},
		{"batch", "application/cloudevents-batch+json", false},
		{"other format", "application/cloudevents+avro", false},
		{"prefix only", "application/cloudevents", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := broker.IsStructured(tt.ct); got != tt.want {
				t.Errorf("IsStructured(%q) = %v, want %v", tt.ct, got, tt.want)
			}
		})
	}
}

func TestParseStructured(t *testing.T) {
	const req = `"id":"order-1","source":"/shop","type":"order.placed","specversion":"1.0"`
	tests := []struct {
		name     string
		body     string
		want     broker.Event // Data as a string below
		data     string
		dataJSON bool
	}{
		{
			name: "json data",
			body: `{` + req + `,"datacontenttype":"application/json","data":{"sku": "a-1", "n": 2}}`,
			want: broker.Event{DataContentType: "application/json"},
			data: `{"sku": "a-1", "n": 2}`, dataJSON: true,
		},
		{
			name: "json data without datacontenttype",
			body: `{` + req + `,"data":[1,2]}`,
			data: `[1,2]`, dataJSON: true,
		},
		{
			name: "json string data",
			body: `{` + req + `,"datacontenttype":"application/json","data":"hi"}`,
			want: broker.Event{DataContentType: "application/json"},
			data: `"hi"`, dataJSON: true,
		},
		{
			name: "text data is the string's text",
			body: `{` + req + `,"datacontenttype":"text/plain","data":"hi \"there\""}`,
			want: broker.Event{DataContentType: "text/plain"},
			data: `hi "there"`,
		},
		{
			name: "base64 data",
			body: `{` + req + `,"datacontenttype":"application/octet-stream","data_base64":"AAEC/w=="}`,
			want: broker.Event{DataContentType: "application/octet-stream"},
			data: "\x00\x01\x02\xff",
		},
		{
			name: "no data",
			body: `{` + req + `}`,
		},
		{
			name: "null members are absent",
			body: `{` + req + `,"data":null,"subject":null,"datacontenttype":null}`,
		},
		{
			name: "optional attributes and extensions in name order",
			body: `{` + req + `,"time":"2026-01-01T00:00:00Z","subject":"o/1","dataschema":"https://s/1",` +
				`"traceparent":"00-abc","partitionkey":"k","retries":3,"sampled":true,"ratio":-1.5e3}`,
			want: broker.Event{Attrs: []broker.Attr{
				{"dataschema", "https://s/1"}, {"partitionkey", "k"}, {"ratio", "-1.5e3"}, {"retries", "3"},
				{"sampled", "true"}, {"subject", "o/1"}, {"time", "2026-01-01T00:00:00Z"}, {"traceparent", "00-abc"},
			}},
		},
		{
			name: "specversion 1.x",
			body: `{"id":"x","source":"s","type":"t","specversion":"1.1"}`,
			want: broker.Event{ID: "x", Source: "s", Type: "t", SpecVersion: "1.1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := broker.ParseStructured([]byte(tt.body))
			if err != nil {
				t.Fatalf("ParseStructured: %v", err)
			}
			want := tt.want
			if want.ID == "" {
				want.ID, want.Source, want.Type, want.SpecVersion = "order-1", "/shop", "order.placed", "1.0"
			}
			if got.ID != want.ID || got.Source != want.Source || got.Type != want.Type ||
				got.SpecVersion != want.SpecVersion || got.DataContentType != want.DataContentType {
				t.Errorf("attributes = %+v, want %+v", got, want)
			}
			if !slices.Equal(got.Attrs, want.Attrs) {
				t.Errorf("Attrs = %v, want %v", got.Attrs, want.Attrs)
			}
			if string(got.Data) != tt.data || got.DataJSON != tt.dataJSON {
				t.Errorf("data = %q (json %v), want %q (json %v)", got.Data, got.DataJSON, tt.data, tt.dataJSON)
			}
			if tt.data == "" && got.Data != nil {
				t.Errorf("data = %q, want none", got.Data)
			}
		})
	}
}

func TestParseStructuredRejects(t *testing.T) {
	tests := []struct{ name, body string }{
		{"empty", ``},
		{"not json", `{"id":`},
		{"trailing garbage", `{"id":"1","source":"s","type":"t","specversion":"1.0"} x`},
		{"array", `[{"id":"1","source":"s","type":"t","specversion":"1.0"}]`},
		{"null", `null`},
		{"string", `"event"`},
		{"no id", `{"source":"s","type":"t","specversion":"1.0"}`},
		{"empty id", `{"id":"","source":"s","type":"t","specversion":"1.0"}`},
		{"null id", `{"id":null,"source":"s","type":"t","specversion":"1.0"}`},
		{"numeric id", `{"id":7,"source":"s","type":"t","specversion":"1.0"}`},
		{"no source", `{"id":"1","type":"t","specversion":"1.0"}`},
		{"no type", `{"id":"1","source":"s","specversion":"1.0"}`},
		{"no specversion", `{"id":"1","source":"s","type":"t"}`},
		{"specversion 0.3", `{"id":"1","source":"s","type":"t","specversion":"0.3"}`},
		{"both data members", `{"id":"1","source":"s","type":"t","specversion":"1.0","data":1,"data_base64":"AA=="}`},
		{"bad base64", `{"id":"1","source":"s","type":"t","specversion":"1.0","data_base64":"***"}`},
		{"base64 not a string", `{"id":"1","source":"s","type":"t","specversion":"1.0","data_base64":5}`},
		{"datacontenttype not a string", `{"id":"1","source":"s","type":"t","specversion":"1.0","datacontenttype":1}`},
		{"object extension", `{"id":"1","source":"s","type":"t","specversion":"1.0","ext":{"a":1}}`},
		{"array extension", `{"id":"1","source":"s","type":"t","specversion":"1.0","ext":[]}`},
		{"control character in id", `{"id":"1\n","source":"s","type":"t","specversion":"1.0"}`},
		{"control character in source", `{"id":"1","source":"s\r\nX: y","type":"t","specversion":"1.0"}`},
		{"C1 control in type", `{"id":"1","source":"s","type":"t\u0085","specversion":"1.0"}`},
		{"tab in datacontenttype", `{"id":"1","source":"s","type":"t","specversion":"1.0","datacontenttype":"a/b;\tx"}`},
		{"NUL in an extension", `{"id":"1","source":"s","type":"t","specversion":"1.0","ext":"\u0000"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := broker.ParseStructured([]byte(tt.body))
			if err == nil {
				t.Fatalf("ParseStructured(%s) = %+v, want an error", tt.body, e)
			}
			if !errors.Is(err, broker.ErrStructured) {
				t.Errorf("error %v does not wrap ErrStructured", err)
			}
		})
	}
}

func TestMessageData(t *testing.T) {
	m := &broker.Message{Body: []byte("envelope")}
	if string(m.Data()) != "envelope" {
		t.Errorf("Data() = %q without an event", m.Data())
	}
	m.Event = &broker.Event{Data: []byte("data")}
	if string(m.Data()) != "data" || string(m.Body) != "envelope" {
		t.Errorf("Data() = %q, Body = %q with an event", m.Data(), m.Body)
	}
}
