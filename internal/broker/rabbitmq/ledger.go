package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/redact"
)

// LedgerQueue is the dead-letter ledger stream of q: the log of the dead
// letters' transitions, beside the dead-letter stream.
func LedgerQueue(q string) string { return DeadLetterQueue(q) + ".ledger" }

// declareLedger makes sure Q.dlq.ledger is a stream, kept as long as the
// dead-letter stream: a record must live as long as the dead letter it
// names, and a repaired body in it is as personal as the original. Without
// Declare it only checks.
func (t Topology) declareLedger(conn *amqp.Connection) error {
	name := LedgerQueue(t.Queue)
	if t.Declare {
		err := onChannel(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(name, true, false, false, false, streamArgs(t.DeadLetterRetention))
			return err
		})
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			if kind, _, ierr := inspectQueue(conn, name); ierr == nil && kind == queueStream {
				t.logger().Warn("the dead-letter ledger stream's arguments differ from the configuration; it is used as it is",
					"stream", name, "broker", ae.Reason)
				return nil
			}
		}
		if err != nil {
			return fmt.Errorf("dead-letter ledger stream %q: %w", name, explain(err))
		}
		return nil
	}
	kind, typ, err := inspectQueue(conn, name)
	switch {
	case err != nil:
		return fmt.Errorf("dead-letter ledger stream %q: %w", name, explain(err))
	case kind == queueMissing:
		return fmt.Errorf("dead-letter ledger stream %q does not exist; with declare: false declare it yourself as a stream (x-queue-type: stream)", name)
	case kind == queueOther:
		return fmt.Errorf("%q is a %s queue, not a stream; declare it as a stream (x-queue-type: stream)", name, typ)
	}
	return nil
}

// StreamLog is one stream of the client's source read from offsets, and
// appended to with confirms: the dead-letter stream or its ledger. A stream
// has no partitions: its one is -1. It is safe for concurrent use; it needs
// the client running, and waits for its connection. It reads on a
// connection of its own (readerConn).
type StreamLog struct {
	c     *Client
	queue string
}

// DeadLetterLog is the source's dead-letter stream, Q.dlq.
func (c *Client) DeadLetterLog() *StreamLog {
	return &StreamLog{c: c, queue: DeadLetterQueue(c.opts.Queue)}
}

// LedgerLog is the source's dead-letter ledger stream, Q.dlq.ledger.
func (c *Client) LedgerLog() *StreamLog {
	return &StreamLog{c: c, queue: LedgerQueue(c.opts.Queue)}
}

// noPartition is a stream's one partition.
const noPartition int32 = -1

// Name is the stream's name.
func (l *StreamLog) Name() string { return l.queue }

// First returns the stream's first offset, or nothing when it is empty.
// AMQP 0.9.1 does not say it: it is the offset of the first message a reader
// from "first" gets.
func (l *StreamLog) First(ctx context.Context) (map[int32]int64, error) {
	conn, err := l.c.readerConn(ctx)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	err = ReadStream(ctx, conn, l.queue, "first", func(d *amqp.Delivery) bool {
		if off := streamOffset(d); off >= 0 {
			out[noPartition] = off
		}
		return false
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Read calls each for every message from from[-1] (the first when absent)
// to the stream's end as ReadStream finds it. The time given is when the
// broker stored the message's chunk when the broker says so, else the
// message's timestamp property.
func (l *StreamLog) Read(ctx context.Context, from map[int32]int64, each func(partition int32, offset int64, at time.Time, m *broker.Message) error) error {
	conn, err := l.c.readerConn(ctx)
	if err != nil {
		return err
	}
	var start any = "first"
	if off, ok := from[noPartition]; ok {
		start = off
	}
	var failed error
	err = ReadStream(ctx, conn, l.queue, start, func(d *amqp.Delivery) bool {
		off := streamOffset(d)
		if off < 0 {
			return true
		}
		// The delivery itself goes along: a replay republishes the
		// original's properties (correlation id, reply-to, priority,
		// timestamp, app id, encoding) and its typed headers from it.
		native := *d
		m := &broker.Message{
			Body:        d.Body,
			ContentType: d.ContentType,
			MessageID:   d.MessageId,
			Type:        d.Type,
			Headers:     stringHeaders(d.Headers),
			Position:    fmt.Sprintf("rabbitmq:%s/%d", l.queue, off),
			Native:      &native,
		}
		delete(m.Headers, streamOffsetArg)
		failed = each(noPartition, off, d.Timestamp, m)
		return failed == nil
	})
	if err != nil {
		return err
	}
	return failed
}

// Append publishes body to the stream and returns once it is confirmed.
func (l *StreamLog) Append(ctx context.Context, body []byte) error {
	s, err := l.c.await(ctx)
	if err != nil {
		return err
	}
	return s.pub.publish(ctx, l.queue, amqp.Publishing{
		Body:         body,
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		Timestamp:    time.Now(),
	})
}

// readerConn returns the connection the dead-letter logs are read on, dialed
// once the client's own connection is up (its topology declared) and again
// after it is lost. It is not the connection that consumes and acks: a
// RabbitMQ 3.10 stream deleted under a reader fails the reader's whole
// connection (541 INTERNAL_ERROR), which must not hand back every delivery
// in flight and declare the topology again.
func (c *Client) readerConn(ctx context.Context) (*amqp.Connection, error) {
	if _, err := c.await(ctx); err != nil {
		return nil, err
	}
	c.readerMu.Lock()
	defer c.readerMu.Unlock()
	if c.reader != nil && !c.reader.IsClosed() {
		return c.reader, nil
	}
	if c.readerStopped {
		return nil, ErrNotConnected
	}
	conn, err := c.dial("handoff " + c.opts.Name + " dead-letter logs")
	if err != nil {
		return nil, fmt.Errorf("dial for the dead-letter logs: %w", redact.Error(err))
	}
	c.reader = conn
	return conn, nil
}

// closeReader closes the readers' connection for good: Run has ended.
func (c *Client) closeReader() {
	c.readerMu.Lock()
	defer c.readerMu.Unlock()
	c.readerStopped = true
	if c.reader != nil {
		_ = c.reader.Close()
	}
}
