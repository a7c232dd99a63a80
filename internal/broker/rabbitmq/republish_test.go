package rabbitmq

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
)

// What the dead-letter manager republishes through (deadletter.Republisher).
var _ interface {
	Republish(context.Context, *broker.Message, broker.Headers) error
} = (*Client)(nil)

// A replayed dead letter goes back to the source queue itself, as the
// original was, with the replay's trail in place of every handoff-* header
// it came with.
func TestRepublishToTheSourceQueue(t *testing.T) {
	t.Parallel()
	forged := map[string]string{
		broker.HeaderAttempt:    "3",
		broker.HeaderDeadReason: "permanent",
		broker.HeaderReplayID:   "an-older-replay",
		"Handoff-Hops":          "2", // any casing is ours
	}
	tests := []struct {
		name string
		msg  func() *broker.Message
		// want are the headers the copy keeps beside the trail, as the
		// queue hands them back.
		want amqp.Table
	}{
		{
			// As the dead-letter stream is read back: headers as text.
			name: "read from the dead-letter stream",
			msg: func() *broker.Message {
				h := broker.Headers{"x-tenant": "acme", "x-count": "7"}
				for k, v := range forged {
					h[k] = v
				}
				return &broker.Message{Body: []byte(`{"fixed":true}`), ContentType: "application/json",
					MessageID: "m-1", Type: "order.placed", Headers: h}
			},
			want: amqp.Table{"x-tenant": "acme", "x-count": "7"},
		},
		{
			// A delivery's own table: typed values kept, the broker's
			// bookkeeping of where it was dropped.
			name: "a native delivery",
			msg: func() *broker.Message {
				table := amqp.Table{"x-tenant": "acme", "x-count": int32(7), streamOffsetArg: int64(42),
					deliveryCountHeader: int64(3), "x-death": []any{amqp.Table{"queue": "q"}}}
				for k, v := range forged {
					table[k] = v
				}
				d := &amqp.Delivery{Body: []byte(`{"fixed":true}`), ContentType: "application/json",
					MessageId: "m-1", Type: "order.placed", CorrelationId: "corr-1", Headers: table}
				return &broker.Message{Body: d.Body, ContentType: d.ContentType, MessageID: d.MessageId,
					Type: d.Type, Headers: stringHeaders(table), Native: d}
			},
			want: amqp.Table{"x-tenant": "acme", "x-count": int32(7)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ch := channel(t)
			q := sourceQueue(t, ch, "republish")
			c := connected(t, q)
			trail := broker.Headers{broker.HeaderEventID: "evt-1", broker.HeaderReplayID: "r-1",
				broker.HeaderReplayOf: DeadLetterQueue(q) + "/7"}
			if err := c.Republish(context.Background(), tt.msg(), trail); err != nil {
				t.Fatal(err)
			}
			// Confirmed means enqueued: the copy is there to get at once.
			d, ok, err := ch.Get(q, true)
			if err != nil || !ok {
				t.Fatalf("get from %s = %v, %v; want the republished copy", q, ok, err)
			}
			if string(d.Body) != `{"fixed":true}` || d.ContentType != "application/json" || d.MessageId != "m-1" ||
				d.Type != "order.placed" || d.DeliveryMode != amqp.Persistent {
				t.Errorf("copy body %q content type %q message id %q type %q delivery mode %d",
					d.Body, d.ContentType, d.MessageId, d.Type, d.DeliveryMode)
			}
			want := amqp.Table{}
			for k, v := range tt.want {
				want[k] = v
			}
			for k, v := range trail {
				want[k] = v
			}
			for k, v := range want {
				if d.Headers[k] != v {
					t.Errorf("header %s = %#v, want %#v", k, d.Headers[k], v)
				}
			}
			// The quorum queue counts deliveries of its own: the count the
			// original came with is not carried over.
			if n, ok := d.Headers[deliveryCountHeader]; ok && n != int64(0) {
				t.Errorf("copy's %s = %#v, want the queue's own count of its first delivery", deliveryCountHeader, n)
			}
			for k, v := range d.Headers {
				if _, ok := want[k]; !ok && k != deliveryCountHeader {
					t.Errorf("header %s = %#v: not the original's nor the trail's", k, v)
				}
			}
			if _, ok, _ := ch.Get(q, true); ok {
				t.Error("a second message in the source queue: one republish made one copy")
			}
		})
	}
}

// A republish to a queue that is gone is an error, never a success.
func TestRepublishToAMissingQueueFails(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "republish-gone")
	c := connected(t, q)
	if _, err := ch.QueueDelete(q, false, false, false); err != nil {
		t.Fatal(err)
	}
	msg := &broker.Message{Body: []byte("b"), MessageID: "m-1"}
	trail := broker.Headers{broker.HeaderEventID: "m-1", broker.HeaderReplayID: "r-1"}
	if err := c.Republish(context.Background(), msg, trail); !errors.Is(err, ErrUnroutable) {
		t.Fatalf("republish to a deleted queue = %v, want %v", err, ErrUnroutable)
	}
}
