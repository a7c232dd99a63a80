package rabbitmq

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultDeadLetterRetention is the dead-letter stream's x-max-age when
// Options.DeadLetterRetention is zero.
const DefaultDeadLetterRetention = 14 * 24 * time.Hour

// deadLetterSegment is the dead-letter stream's segment size. A stream
// applies its x-max-age only to whole segments, and only when it starts a new
// one: with RabbitMQ's default of 500 MB a quieter dead-letter stream would
// keep everything, whatever its retention.
const deadLetterSegment = 16 << 20

// streamArgs are the arguments of a dead-letter stream kept for retention.
func streamArgs(retention time.Duration) amqp.Table {
	return amqp.Table{
		amqp.QueueTypeArg:                 amqp.QueueTypeStream,
		amqp.StreamMaxAgeArg:              maxAge(retention),
		amqp.StreamMaxSegmentSizeBytesArg: int64(deadLetterSegment),
	}
}

// maxAge writes d in the units x-max-age takes (D, h, m, s), in the largest
// unit that holds it exactly; a part of a second counts as a whole one.
func maxAge(d time.Duration) string {
	if d <= 0 {
		d = DefaultDeadLetterRetention
	}
	switch {
	case d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "D"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	}
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10) + "s"
}

// streamHeaders is h as a stream keeps it. RabbitMQ 3.10 stores a stream
// message in AMQP 1.0 form, whose application properties hold only simple
// values: it silently drops a header whose value is a table or an array, and
// a decimal one fails the publish with an internal error that closes the
// whole connection. Such values are written as text instead: a decimal as its
// decimal string, a table or array as JSON. h itself is not changed.
func streamHeaders(h amqp.Table) amqp.Table {
	var out amqp.Table
	for k, v := range h {
		var s string
		switch v := v.(type) {
		case amqp.Decimal:
			s = decimalString(v)
		case amqp.Table, []any:
			b, err := json.Marshal(jsonValue(v))
			if err != nil {
				s = fmt.Sprint(v)
			} else {
				s = string(b)
			}
		default:
			continue
		}
		if out == nil {
			out = make(amqp.Table, len(h))
			for k, v := range h {
				out[k] = v
			}
		}
		out[k] = s
	}
	if out == nil {
		return h
	}
	return out
}

// jsonValue is v with every AMQP value JSON cannot write as such made text.
func jsonValue(v any) any {
	switch v := v.(type) {
	case amqp.Table:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = jsonValue(x)
		}
		return m
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = jsonValue(x)
		}
		return out
	case amqp.Decimal:
		return decimalString(v)
	case []byte:
		return string(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339)
	}
	return v
}

// deliveryCountHeader is the header in which a quorum queue counts a
// message's deliveries.
const deliveryCountHeader = "x-delivery-count"

// publishingOf is a delivery published again unchanged, as far as a stream
// keeps it: the broker's own headers (a quorum queue's x-delivery-count, a
// stream's x-stream-offset) are left out, and so are expiration (the copy
// would expire) and user id (the broker refuses one that is not ours), as on
// every copy.
func publishingOf(d *amqp.Delivery) amqp.Publishing {
	var h amqp.Table
	if len(d.Headers) > 0 {
		h = make(amqp.Table, len(d.Headers))
		for k, v := range d.Headers {
			if k != streamOffsetArg && k != deliveryCountHeader {
				h[k] = v
			}
		}
	}
	return amqp.Publishing{
		Headers:         streamHeaders(h),
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    d.DeliveryMode,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		ReplyTo:         d.ReplyTo,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// fingerprint identifies a message by everything a copy keeps: body,
// properties and headers. Header values are compared by their text, so that
// a value the broker hands back as another Go type (a timestamp in another
// location, an int8 read as an int64) still matches.
func fingerprint(p amqp.Publishing) [32]byte {
	h := sha256.New()
	field := func(s string) {
		_, _ = h.Write([]byte(strconv.Itoa(len(s))))
		_, _ = h.Write([]byte{':'})
		_, _ = h.Write([]byte(s))
	}
	for _, s := range []string{p.ContentType, p.ContentEncoding, strconv.Itoa(int(p.DeliveryMode)),
		strconv.Itoa(int(p.Priority)), p.CorrelationId, p.ReplyTo, p.MessageId,
		strconv.FormatInt(p.Timestamp.Unix(), 10), p.Type, p.AppId} {
		field(s)
	}
	keys := make([]string, 0, len(p.Headers))
	for k := range p.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		field(k)
		field(valueText(p.Headers[k]))
	}
	field(string(p.Body))
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

func valueText(v any) string {
	if t, ok := v.(time.Time); ok {
		return strconv.FormatInt(t.Unix(), 10)
	}
	if s, ok := headerString(v); ok {
		return s
	}
	b, err := json.Marshal(jsonValue(v))
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
