package rabbitmq

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
)

// stringHeaders is the string view of an AMQP header table. Values that have
// no single string form (nested tables and arrays) are left out of the view;
// copies still carry them, from the native table.
func stringHeaders(t amqp.Table) broker.Headers {
	h := make(broker.Headers, len(t))
	for k, v := range t {
		if s, ok := headerString(v); ok {
			h[k] = s
		}
	}
	return h
}

func headerString(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	case bool:
		return strconv.FormatBool(v), true
	case int8:
		return strconv.FormatInt(int64(v), 10), true
	case int16:
		return strconv.FormatInt(int64(v), 10), true
	case int32:
		return strconv.FormatInt(int64(v), 10), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case int:
		return strconv.Itoa(v), true
	case uint8:
		return strconv.FormatUint(uint64(v), 10), true
	case uint16:
		return strconv.FormatUint(uint64(v), 10), true
	case uint32:
		return strconv.FormatUint(uint64(v), 10), true
	case float32:
		return strconv.FormatFloat(float64(v), 'g', -1, 32), true
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), true
	case time.Time:
		return v.UTC().Format(time.RFC3339), true
	case amqp.Decimal:
		return decimalString(v), true
	}
	return "", false
}

func decimalString(d amqp.Decimal) string {
	s := strconv.FormatInt(int64(d.Value), 10)
	if d.Scale == 0 {
		return s
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for len(s) <= int(d.Scale) {
		s = "0" + s
	}
	s = s[:len(s)-int(d.Scale)] + "." + s[len(s)-int(d.Scale):]
	if neg {
		s = "-" + s
	}
	return s
}

// brokerOwned are headers RabbitMQ adds on dead-lettering, and a quorum
// queue's count of deliveries. A copy does not carry them: they grow with
// every hop, the trail lives in handoff-*, and a copy is a new message whose
// deliveries start again at none.
func brokerOwned(k string) bool {
	return k == "x-death" || k == deliveryCountHeader || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-")
}

// copyOf builds the publishing of a retry or dead-letter copy: the original's
// body, properties and headers, minus every handoff-* header, plus the trail.
func copyOf(msg *broker.Message, trail broker.Headers) amqp.Publishing {
	p := amqp.Publishing{
		Body:         msg.Body,
		ContentType:  msg.ContentType,
		MessageId:    msg.MessageID,
		Type:         msg.Type,
		DeliveryMode: amqp.Persistent,
	}
	headers := amqp.Table{}
	if d, ok := msg.Native.(*amqp.Delivery); ok {
		// Expiration is dropped: the copy would expire in its delay queue.
		// UserId is dropped: the broker rejects one that is not ours.
		if sameBytes(msg.Body, d.Body) {
			// The encoding describes the original's bytes: a body
			// repaired before a replay is sent as the operator gave it.
			p.ContentEncoding = d.ContentEncoding
		}
		p.Priority = d.Priority
		p.CorrelationId = d.CorrelationId
		p.ReplyTo = d.ReplyTo
		p.Timestamp = d.Timestamp
		p.AppId = d.AppId
		for k, v := range d.Headers {
			if !broker.IsOwned(k) && !brokerOwned(k) {
				headers[k] = v
			}
		}
	} else {
		for k, v := range msg.Headers {
			if !broker.IsOwned(k) {
				headers[k] = v
			}
		}
	}
	for k, v := range trail {
		headers[k] = v
	}
	p.Headers = headers
	return p
}

// sameBytes reports whether a and b hold the same bytes, at once when they
// are the same slice (a retry copy's body always is the delivery's).
func sameBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	return bytes.Equal(a, b)
}
