package rabbitmq

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestStreamHeaders(t *testing.T) {
	in := amqp.Table{"s": "v", "n": int32(3), "d": amqp.Decimal{Scale: 2, Value: -5},
		"t": amqp.Table{"b": []byte("x"), "d": amqp.Decimal{Scale: 1, Value: 15}}, "a": []any{"x", int64(2)}}
	out := streamHeaders(in)
	want := amqp.Table{"s": "v", "n": int32(3), "d": "-0.05", "t": `{"b":"x","d":"1.5"}`, "a": `["x",2]`}
	for k, v := range want {
		if out[k] != v {
			t.Errorf("%s = %#v, want %#v", k, out[k], v)
		}
	}
	if _, ok := in["d"].(amqp.Decimal); !ok {
		t.Error("streamHeaders changed its input")
	}
	plain := amqp.Table{"s": "v"}
	if got := streamHeaders(plain); len(got) != 1 || got["s"] != "v" {
		t.Errorf("simple headers changed: %v", got)
	}
}

// A copy read back from a stream matches its original although the broker
// hands some values back as other Go types; a changed value does not.
func TestFingerprintMatchesWhatAStreamHandsBack(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	orig := amqp.Publishing{MessageId: "m", Body: []byte("b"), Timestamp: at,
		Headers: amqp.Table{"n": int8(3), "t": at, "s": "v"}}
	back := orig
	back.Timestamp = at.In(time.FixedZone("x", 3600))
	back.Headers = amqp.Table{"n": int64(3), "t": at.Local(), "s": "v"}
	if fingerprint(orig) != fingerprint(back) {
		t.Error("the same message read back has another fingerprint")
	}
	changed := back
	changed.Headers = amqp.Table{"n": int64(4), "t": at, "s": "v"}
	if fingerprint(orig) == fingerprint(changed) {
		t.Error("a changed header has the same fingerprint")
	}
	body := orig
	body.Body = []byte("c")
	if fingerprint(orig) == fingerprint(body) {
		t.Error("a changed body has the same fingerprint")
	}
}
