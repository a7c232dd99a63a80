package broker

import (
	"fmt"
	"strings"
	"time"
)

// Headers is the string view of a message's application headers. Adapters
// convert their native header values to strings for it; the native form is
// kept in Message.Native so copies can carry the originals unchanged.
type Headers map[string]string

// Message is one consumed message, as the engine and the app see it.
type Message struct {
	Body        []byte
	ContentType string
	// MessageID is the broker's message id property (AMQP message_id), if any.
	MessageID string
	// Type is the broker's type property (AMQP type), if any.
	Type string
	// Key is the partitioning key (Kafka), if any.
	Key []byte
	// Headers as received, handoff-* included.
	Headers Headers
	// Position is the message's stable place in its log ("kafka:orders/3/1207"),
	// empty where the broker has none (RabbitMQ).
	Position string
	// Origin says where the message was first consumed, for example
	// "rabbitmq:orders" or "kafka:orders/3/1207".
	Origin string
	// OrderKey, when not empty, names the sequence the message belongs to:
	// messages with the same OrderKey are handed to the app one at a time, in
	// delivery order (Kafka ordering key or partition).
	OrderKey string
	// Copy says the message was consumed from a destination the sidecar
	// writes to itself (a retry queue or topic): its handoff-* headers are
	// the sidecar's own and are read; on any other message they are ignored.
	Copy bool
	// Redelivered is the broker's own flag: this delivery was handed out
	// before and not settled.
	Redelivered bool
	// DeliveryCount is how many times the broker handed the message out
	// before and had it returned (a quorum queue's x-delivery-count); 0
	// where the broker does not count.
	DeliveryCount int
	// FinalDelivery says the broker drops the message, or dead-letters it
	// by its own policy, if it is returned once more: its delivery count has
	// reached the queue's delivery limit. Such a delivery is not handed to
	// the app, whose call could be cut by a crash; it is moved out of the
	// broker's count instead (see dispatch).
	FinalDelivery bool
	// Event is the CloudEvent a structured-mode message carries (its
	// content type is StructuredContentType), read from Body at intake; nil
	// for any other message. Body stays the envelope: copies carry it as it
	// came. The app gets the event's attributes, and Data as the body.
	Event *Event
	// Native is the adapter's own representation of the message. The engine
	// never looks inside; the adapter that produced it uses it to build copies
	// with the original headers and properties intact.
	Native any
}

// Data is what the app gets as the message's body: a structured-mode
// event's data, else the body as received.
func (m *Message) Data() []byte {
	if m.Event != nil {
		return m.Event.Data
	}
	return m.Body
}

// Delivery is a message with the handle that settles it. Exactly one of Ack or
// Release should be called; both are safe for concurrent use with other
// deliveries.
type Delivery interface {
	Message() *Message
	// Ack settles the message: the broker forgets it. It fails when the
	// delivery's channel or session is gone, in which case the broker has
	// already taken the message back for redelivery. An adapter may send the
	// ack later, coalesced with others; one lost on the way means a
	// redelivery, which the journal recognises as settled.
	Ack() error
	// Release hands the message back unsettled, for redelivery.
	Release() error
	// Lost is closed once the delivery can no longer be settled because its
	// channel or session ended; the broker redelivers it.
	Lost() <-chan struct{}
}

// Fenced is a Delivery whose hand-out is being made durable: a Kafka
// partition's handed-out mark, which flags the record redelivered if it
// comes again after a crash. No call may be made for it before Durable is
// closed; nil means nothing to wait for.
type Fenced interface {
	Durable() <-chan struct{}
}

// Answered is a Delivery whose broker can take another in its place once
// the app has answered it and only the commit of its outcome is left before
// its Ack: a Kafka record, whose window of records in flight is the
// sidecar's own. Answered is called at most once, before Ack, and only when
// nothing more is wanted of the message but its Ack or Release.
type Answered interface {
	Answered()
}

// Destination names where a copy goes.
type Destination struct {
	// DeadLetter selects the dead-letter destination; otherwise the copy goes
	// to the retry tier Tier.
	DeadLetter bool
	Tier       time.Duration
}

func (d Destination) String() string {
	if d.DeadLetter {
		return "dlq"
	}
	return "retry." + TierName(d.Tier)
}

// ParseDestination reads what Destination.String wrote.
func ParseDestination(s string) (Destination, error) {
	if s == "dlq" {
		return Destination{DeadLetter: true}, nil
	}
	if tier, ok := strings.CutPrefix(s, "retry."); ok {
		if d, err := time.ParseDuration(tier); err == nil && d > 0 {
			return Destination{Tier: d}, nil
		}
	}
	return Destination{}, fmt.Errorf("unknown destination %q", s)
}

// IsOwned reports whether a header name belongs to the sidecar (handoff-*).
// Owned headers are stripped from a message on its first entry.
func IsOwned(name string) bool {
	return len(name) >= len(headerPrefix) && strings.EqualFold(name[:len(headerPrefix)], headerPrefix)
}
