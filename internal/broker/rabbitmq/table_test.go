package rabbitmq

import (
	"maps"
	"math"
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
)

func TestStringHeaders(t *testing.T) {
	cest := time.FixedZone("CEST", 2*3600)
	tests := []struct {
		name  string
		value any
		want  string
		// omitted means the value has no string form and must be left out.
		omitted bool
	}{
		{name: "string", value: "tenant-a", want: "tenant-a"},
		{name: "empty string", value: "", want: ""},
		{name: "bytes", value: []byte("raw\x00bytes"), want: "raw\x00bytes"},
		{name: "bool true", value: true, want: "true"},
		{name: "bool false", value: false, want: "false"},
		{name: "int8", value: int8(math.MinInt8), want: "-128"},
		{name: "int16", value: int16(math.MinInt16), want: "-32768"},
		{name: "int32", value: int32(math.MaxInt32), want: "2147483647"},
		{name: "int64", value: int64(math.MinInt64), want: "-9223372036854775808"},
		{name: "int", value: int(-42), want: "-42"},
		{name: "uint8", value: uint8(math.MaxUint8), want: "255"},
		{name: "uint16", value: uint16(math.MaxUint16), want: "65535"},
		{name: "uint32", value: uint32(math.MaxUint32), want: "4294967295"},
		{name: "float32 shortest form", value: float32(0.1), want: "0.1"},
		{name: "float32 whole", value: float32(3), want: "3"},
		{name: "float64", value: 2.5, want: "2.5"},
		{name: "float64 large", value: 1e21, want: "1e+21"},
		{name: "float64 negative", value: -0.25, want: "-0.25"},
		{name: "time in UTC", value: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC), want: "2026-03-04T05:06:07Z"},
		{name: "time in another zone", value: time.Date(2026, 3, 4, 5, 6, 7, 8, cest), want: "2026-03-04T03:06:07Z"},
		{name: "decimal", value: amqp.Decimal{Scale: 2, Value: 12345}, want: "123.45"},
		{name: "decimal negative below one", value: amqp.Decimal{Scale: 3, Value: -5}, want: "-0.005"},
		{name: "decimal scale zero", value: amqp.Decimal{Scale: 0, Value: 12345}, want: "12345"},
		{name: "decimal scale zero negative", value: amqp.Decimal{Scale: 0, Value: -7}, want: "-7"},
		{name: "decimal scale equals digits", value: amqp.Decimal{Scale: 2, Value: 45}, want: "0.45"},
		{name: "decimal zero", value: amqp.Decimal{Scale: 2, Value: 0}, want: "0.00"},
		{name: "decimal negative", value: amqp.Decimal{Scale: 2, Value: -12345}, want: "-123.45"},
		{name: "decimal min int32", value: amqp.Decimal{Scale: 4, Value: math.MinInt32}, want: "-214748.3648"},
		{name: "nested table", value: amqp.Table{"a": "b"}, omitted: true},
		{name: "array", value: []any{"a", int32(1)}, omitted: true},
		{name: "nil", value: nil, omitted: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := stringHeaders(amqp.Table{"k": tt.value, "other": "x"})
			got, ok := h["k"]
			if tt.omitted {
				if ok {
					t.Errorf("stringHeaders kept %T as %q, want it left out", tt.value, got)
				}
			} else if !ok || got != tt.want {
				t.Errorf("stringHeaders(%T %v) = %q (present %v), want %q", tt.value, tt.value, got, ok, tt.want)
			}
			if h["other"] != "x" {
				t.Errorf("other header = %q, want %q", h["other"], "x")
			}
		})
	}
}

// testTrail is the trail copyOf is given in TestCopyOf.
var testTrail = broker.Headers{
	broker.HeaderEventID: "evt-1",
	broker.HeaderAttempt: "2",
	broker.HeaderError:   "boom",
}

func TestCopyOf(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	nested := amqp.Table{"inner": int64(1)}
	delivery := func(headers amqp.Table) amqp.Delivery {
		return amqp.Delivery{
			Headers:         headers,
			ContentType:     "application/json",
			ContentEncoding: "gzip",
			DeliveryMode:    amqp.Transient,
			Priority:        7,
			CorrelationId:   "corr-1",
			ReplyTo:         "replies",
			Expiration:      "60000",
			MessageId:       "msg-1",
			Timestamp:       ts,
			Type:            "order.created",
			UserId:          "guest",
			AppId:           "shop",
			Body:            []byte(`{"id":1}`),
			Redelivered:     true,
			Exchange:        "orders",
			RoutingKey:      "orders",
		}
	}
	// fromDelivery is the publishing every native case expects, headers aside.
	fromDelivery := amqp.Publishing{
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		DeliveryMode:    amqp.Persistent,
		Priority:        7,
		CorrelationId:   "corr-1",
		ReplyTo:         "replies",
		MessageId:       "msg-1",
		Timestamp:       ts,
		Type:            "order.created",
		AppId:           "shop",
		Body:            []byte(`{"id":1}`),
	}
	tests := []struct {
		name        string
		msg         func() *broker.Message
		want        amqp.Publishing
		wantHeaders amqp.Table
	}{
		{
			name: "native headers keep their types",
			msg: func() *broker.Message {
				return newDelivery(delivery(amqp.Table{
					"tenant":   "a",
					"count":    int32(3),
					"big":      int64(1) << 40,
					"flag":     true,
					"price":    amqp.Decimal{Scale: 2, Value: 999},
					"nested":   nested,
					"list":     []any{"a", int16(2)},
					"raw":      []byte("r"),
					"nothing":  nil,
					"x-custom": "keep",
				}), "rabbitmq:orders", false, nil, nil).Message()
			},
			want: fromDelivery,
			wantHeaders: amqp.Table{
				"tenant":   "a",
				"count":    int32(3),
				"big":      int64(1) << 40,
				"flag":     true,
				"price":    amqp.Decimal{Scale: 2, Value: 999},
				"nested":   nested,
				"list":     []any{"a", int16(2)},
				"raw":      []byte("r"),
				"nothing":  nil,
				"x-custom": "keep",
			},
		},
		{
			name: "native handoff and broker-owned headers are removed",
			msg: func() *broker.Message {
				return newDelivery(delivery(amqp.Table{
					"tenant":                 "a",
					"handoff-attempt":        "9",
					"Handoff-Event-Id":       "old",
					"HANDOFF-DEADLINE":       "2020-01-01T00:00:00Z",
					"handoff-replay-id":      "r-1",
					"x-death":                []any{amqp.Table{"count": int64(1), "queue": "orders"}},
					"x-first-death-queue":    "orders",
					"x-first-death-reason":   "rejected",
					"x-first-death-exchange": "",
					"x-last-death-queue":     "orders.retry.10s",
					"x-last-death-reason":    "expired",
					"x-last-death-exchange":  "",
					"x-custom-header":        int64(4),
					"not-handoff-attempt":    "keep",
					"x-first-death-other":    "gone too",
				}), "rabbitmq:orders", false, nil, nil).Message()
			},
			want: fromDelivery,
			wantHeaders: amqp.Table{
				"tenant":              "a",
				"x-custom-header":     int64(4),
				"not-handoff-attempt": "keep",
			},
		},
		{
			name: "no native headers",
			msg: func() *broker.Message {
				return newDelivery(delivery(nil), "rabbitmq:orders", false, nil, nil).Message()
			},
			want:        fromDelivery,
			wantHeaders: amqp.Table{},
		},
		{
			name: "without native, the string view minus handoff headers",
			msg: func() *broker.Message {
				return &broker.Message{
					Body:        []byte("b"),
					ContentType: "text/plain",
					MessageID:   "m-2",
					Type:        "t",
					Headers: broker.Headers{
						"tenant":           "a",
						"count":            "3",
						"handoff-attempt":  "9",
						"Handoff-Error":    "old",
						"HANDOFF-ORIGIN":   "kafka:x/0/1",
						"x-handoff-custom": "keep",
					},
				}
			},
			want: amqp.Publishing{
				Body:         []byte("b"),
				ContentType:  "text/plain",
				MessageId:    "m-2",
				Type:         "t",
				DeliveryMode: amqp.Persistent,
			},
			wantHeaders: amqp.Table{
				"tenant":           "a",
				"count":            "3",
				"x-handoff-custom": "keep",
			},
		},
		{
			name: "native of another type falls back to the string view",
			msg: func() *broker.Message {
				d := delivery(amqp.Table{"tenant": "a", "count": int32(3), "handoff-attempt": "9"})
				m := newDelivery(d, "rabbitmq:orders", false, nil, nil).Message()
				m.Native = d // not a *amqp.Delivery
				return m
			},
			want: amqp.Publishing{
				Body:         []byte(`{"id":1}`),
				ContentType:  "application/json",
				MessageId:    "msg-1",
				Type:         "order.created",
				DeliveryMode: amqp.Persistent,
			},
			wantHeaders: amqp.Table{"tenant": "a", "count": "3"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := tt.msg()
			var nativeBefore amqp.Table
			if d, ok := msg.Native.(*amqp.Delivery); ok {
				nativeBefore = maps.Clone(d.Headers)
			}
			viewBefore := maps.Clone(msg.Headers)

			got := copyOf(msg, testTrail)

			wantHeaders := maps.Clone(tt.wantHeaders)
			for k, v := range testTrail {
				wantHeaders[k] = v
			}
			if !reflect.DeepEqual(got.Headers, wantHeaders) {
				t.Errorf("headers:\n got  %#v\n want %#v", got.Headers, wantHeaders)
			}
			if got.DeliveryMode != amqp.Persistent {
				t.Errorf("DeliveryMode = %d, want Persistent", got.DeliveryMode)
			}
			if got.Expiration != "" {
				t.Errorf("Expiration = %q, want it dropped", got.Expiration)
			}
			if got.UserId != "" {
				t.Errorf("UserId = %q, want it dropped", got.UserId)
			}
			got.Headers, tt.want.Headers = nil, nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("properties:\n got  %+v\n want %+v", got, tt.want)
			}

			// The copy must not change the message it was made from.
			if d, ok := msg.Native.(*amqp.Delivery); ok && !reflect.DeepEqual(d.Headers, nativeBefore) {
				t.Errorf("native headers changed to %#v, were %#v", d.Headers, nativeBefore)
			}
			if !maps.Equal(msg.Headers, viewBefore) {
				t.Errorf("string view changed to %v, was %v", msg.Headers, viewBefore)
			}
		})
	}
}

// TestCopyOfTrailWins checks that the trail passed in replaces the original's
// handoff-* headers, whatever their case, rather than sitting beside them.
func TestCopyOfTrailWins(t *testing.T) {
	tests := []struct {
		name    string
		headers amqp.Table
	}{
		{name: "same case", headers: amqp.Table{"handoff-attempt": "9", "handoff-event-id": "old"}},
		{name: "other case", headers: amqp.Table{"Handoff-Attempt": "9", "HANDOFF-EVENT-ID": "old"}},
		{name: "other types", headers: amqp.Table{"handoff-attempt": int32(9), "handoff-event-id": []byte("old")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := newDelivery(amqp.Delivery{Headers: tt.headers}, "rabbitmq:orders", false, nil, nil).Message()
			got := copyOf(msg, broker.Headers{broker.HeaderEventID: "evt-1", broker.HeaderAttempt: "2"})
			want := amqp.Table{broker.HeaderEventID: "evt-1", broker.HeaderAttempt: "2"}
			if !reflect.DeepEqual(got.Headers, want) {
				t.Errorf("headers = %#v, want %#v", got.Headers, want)
			}
		})
	}
}
