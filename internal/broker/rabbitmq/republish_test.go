package rabbitmq

import (
	"context"
	"errors"
	"testing"
	"time"

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

// A dead letter read back from its stream and replayed keeps the original's
// AMQP properties: what the app got the first time is what it gets again.
func TestReplayedDeadLetterKeepsItsProperties(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ch := channel(t)
	q := sourceQueue(t, ch, "replay-props")
	c := connected(t, q)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	orig := &amqp.Delivery{Body: []byte(`{"n":1}`), ContentType: "application/json", ContentEncoding: "identity",
		MessageId: "m-1", Type: "order.placed", CorrelationId: "corr-1", ReplyTo: "replies", Priority: 3,
		Timestamp: at, AppId: "shop", Headers: amqp.Table{"x-count": int32(7)}}
	msg := &broker.Message{Body: orig.Body, ContentType: orig.ContentType, MessageID: orig.MessageId, Type: orig.Type, Native: orig}
	dead := broker.Trail{EventID: "ev-1", Attempt: 1, Hops: 1, DeadReason: "permanent"}
	trail := dead.Headers()
	if err := c.Transfer(ctx, broker.Destination{DeadLetter: true}, msg, trail); err != nil {
		t.Fatal(err)
	}
	var letters []*broker.Message
	if err := c.DeadLetterLog().Read(ctx, nil, func(_ int32, _ int64, _ time.Time, m *broker.Message) error {
		letters = append(letters, m)
		return nil
	}); err != nil || len(letters) != 1 {
		t.Fatalf("read the dead letter back: %d, %v", len(letters), err)
	}
	replay := broker.Headers{broker.HeaderEventID: "ev-1", broker.HeaderReplayID: "r-1"}
	if err := c.Republish(ctx, letters[0], replay); err != nil {
		t.Fatal(err)
	}
	d, ok, err := ch.Get(q, true)
	if err != nil || !ok {
		t.Fatalf("get the replayed copy: %v, %v", ok, err)
	}
	if d.ContentType != orig.ContentType || d.ContentEncoding != orig.ContentEncoding || d.MessageId != orig.MessageId ||
		d.Type != orig.Type || d.CorrelationId != orig.CorrelationId || d.ReplyTo != orig.ReplyTo ||
		d.Priority != orig.Priority || !d.Timestamp.Equal(at) || d.AppId != orig.AppId {
		t.Errorf("replayed copy's properties %+v, want the original's %+v", d, orig)
	}
	if d.Headers["x-count"] != int32(7) || d.Headers[broker.HeaderReplayID] != "r-1" || d.Headers[broker.HeaderDeadReason] != nil {
		t.Errorf("replayed copy's headers %v", d.Headers)
	}

	// Repaired before the replay: the new body goes as given, without the
	// encoding that described the old one; the other properties stay.
	repaired := *letters[0]
	repaired.Body = []byte(`{"n":2}`)
	if err := c.Republish(ctx, &repaired, replay); err != nil {
		t.Fatal(err)
	}
	d, ok, err = ch.Get(q, true)
	if err != nil || !ok {
		t.Fatalf("get the repaired copy: %v, %v", ok, err)
	}
	if string(d.Body) != `{"n":2}` || d.ContentEncoding != "" || d.CorrelationId != orig.CorrelationId {
		t.Errorf("repaired copy: body %s, encoding %q, correlation id %q", d.Body, d.ContentEncoding, d.CorrelationId)
	}
}
