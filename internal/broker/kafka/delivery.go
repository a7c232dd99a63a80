package kafka

import (
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
)

// contentTypeHeader is the header a record's content type is read from.
const contentTypeHeader = "content-type"

// delivery is one record with its handle.
type delivery struct {
	c   *Client
	st  *partition
	r   *kgo.Record
	msg broker.Message
	// durable is closed once the poll's handed-out marks are written.
	durable <-chan struct{}
	// state says whether the record is in the window of MaxInFlight,
	// answered and out of it (holding bytes of maxAnsweredBytes), or
	// finished.
	state atomic.Int32
	bytes int64
}

var (
	_ broker.Delivery = (*delivery)(nil)
	_ broker.Fenced   = (*delivery)(nil)
	_ broker.Answered = (*delivery)(nil)
)

// Answered frees the record's slot in the window of MaxInFlight: the app
// has answered, and the record waits only for its outcome's commit before
// its Ack. It stays unsettled (its offset is not committed) until then. A
// record that would take the bytes held so past maxAnsweredBytes keeps its
// slot, as before it was answered.
func (d *delivery) Answered() {
	n := int64(len(d.r.Key) + len(d.r.Value))
	if d.c.answeredBytes.Add(n) > d.c.maxAnswered {
		d.c.answeredBytes.Add(-n)
		return
	}
	d.bytes = n
	if d.state.CompareAndSwap(inWindow, answered) {
		<-d.c.sem
		return
	}
	d.c.answeredBytes.Add(-n) // finished meanwhile
}

// finished gives back what d holds of the window, once: its slot, or the
// bytes it took when it left the window answered.
func (d *delivery) finished() {
	switch d.state.Swap(done) {
	case inWindow:
		<-d.c.sem
	case answered:
		d.c.answeredBytes.Add(-d.bytes)
	}
}

// A delivery's states: in the window of MaxInFlight, answered and out of
// it, or finished.
const (
	inWindow int32 = iota
	answered
	done
)

// Durable is closed once the record's handed-out mark is in the journal.
func (d *delivery) Durable() <-chan struct{} { return d.durable }

// recordMessage is r as a message: its body, key, headers (the content
// type among them) and its position, which is its origin too.
func recordMessage(r *kgo.Record) broker.Message {
	h := make(broker.Headers, len(r.Headers))
	// The header values and the position share one string: one
	// allocation for a record, not one each.
	var pbuf [96]byte
	pos := appendPosition(pbuf[:0], r)
	n := len(pos)
	for _, kv := range r.Headers {
		n += len(kv.Value)
	}
	var b strings.Builder
	b.Grow(n)
	b.Write(pos)
	for _, kv := range r.Headers {
		b.Write(kv.Value)
	}
	all := b.String()
	var contentType string
	at := len(pos)
	for _, kv := range r.Headers {
		v := all[at : at+len(kv.Value)]
		at += len(kv.Value)
		h[kv.Key] = v
		if kv.Key == contentTypeHeader {
			contentType = v
		}
	}
	origin := all[:len(pos)]
	return broker.Message{Body: r.Value, ContentType: contentType, Key: r.Key, Headers: h, Position: origin, Origin: origin, Native: r}
}

func (c *Client) newDelivery(st *partition, r *kgo.Record) *delivery {
	d := &delivery{c: c, st: st, r: r, msg: recordMessage(r)}
	var order string
	if !c.retry[r.Topic] {
		switch c.o.Ordering {
		case broker.OrderPartition:
			order = r.Topic + "/" + strconv.Itoa(int(r.Partition))
		case broker.OrderKey:
			// A key lives in one partition; the partition in the name keeps
			// keys of two topics apart.
			order = r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + string(r.Key)
		}
	}
	d.msg.OrderKey = order
	d.msg.Copy = c.retry[r.Topic]
	// At or below the mark found at assignment: handed out before this
	// assignment, by this journal's sidecar, perhaps to the app.
	d.msg.Redelivered = r.Offset <= st.handedBefore
	return d
}

func (d *delivery) Message() *broker.Message { return &d.msg }

// Ack settles the record: its offset may be committed once every record
// before it is settled too.
func (d *delivery) Ack() error {
	d.c.settle(d)
	return nil
}

// Release leaves the record unsettled: it holds its partition's commit and
// is consumed again by the partition's next owner.
func (d *delivery) Release() error {
	d.st.finish(d, d.c)
	return nil
}

// Lost is closed when the record's partition was revoked or lost.
func (d *delivery) Lost() <-chan struct{} { return d.st.lost }

// appendPosition appends r's place in its log to b:
// kafka:topic/partition/offset.
func appendPosition(b []byte, r *kgo.Record) []byte {
	b = append(b, "kafka:"...)
	b = append(b, r.Topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(r.Partition), 10)
	b = append(b, '/')
	return strconv.AppendInt(b, r.Offset, 10)
}
