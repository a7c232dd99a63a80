package kafka

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
)

// A record's message carries its headers, its content type and its
// position, which names its topic, partition and offset whatever their
// length; all of them share one allocation.
func TestRecordMessage(t *testing.T) {
	long := strings.Repeat("t", 200)
	hdrs := []kgo.RecordHeader{
		{Key: "ce-id", Value: []byte("order-1")},
		{Key: "empty", Value: nil},
		{Key: contentTypeHeader, Value: []byte("application/json")},
		{Key: "traceparent", Value: []byte(strings.Repeat("0", 55))},
	}
	for _, c := range []struct {
		r       kgo.Record
		pos, ct string
		headers broker.Headers
	}{
		{kgo.Record{Topic: "orders", Partition: 0, Offset: 0}, "kafka:orders/0/0", "", broker.Headers{}},
		{kgo.Record{Topic: "orders", Partition: 11, Offset: 9223372036854775807, Headers: hdrs},
			"kafka:orders/11/9223372036854775807", "application/json",
			broker.Headers{"ce-id": "order-1", "empty": "", contentTypeHeader: "application/json", "traceparent": strings.Repeat("0", 55)}},
		{kgo.Record{Topic: long, Partition: 2147483647, Offset: 42, Headers: hdrs[:1]},
			"kafka:" + long + "/2147483647/42", "", broker.Headers{"ce-id": "order-1"}},
	} {
		m := recordMessage(&c.r)
		if m.Position != c.pos || m.Origin != c.pos {
			t.Errorf("position %q, origin %q; want %q", m.Position, m.Origin, c.pos)
		}
		if m.ContentType != c.ct {
			t.Errorf("content type %q, want %q", m.ContentType, c.ct)
		}
		if len(m.Headers) != len(c.headers) {
			t.Errorf("headers %v, want %v", m.Headers, c.headers)
		}
		for k, v := range c.headers {
			if got, ok := m.Headers[k]; !ok || got != v {
				t.Errorf("header %s = %q, want %q", k, got, v)
			}
		}
	}
	r := kgo.Record{Topic: "orders", Headers: hdrs}
	if n := testing.AllocsPerRun(100, func() { recordMessage(&r) }); n > 3 {
		t.Errorf("%v allocations a record, want at most 3: the headers' map (two) and one string", n)
	}
}
