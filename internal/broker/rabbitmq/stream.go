package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// streamOffsetArg is the consumer argument that says where a stream reader
// starts, and the header each stream delivery carries its offset in.
const streamOffsetArg = "x-stream-offset"

// streamPrefetch is a stream reader's credit: a stream consumer must have a
// prefetch, and acks only give credit back (reading removes nothing).
const streamPrefetch = 500

// streamQuiet is how long a reader that holds credit waits for the next
// message before it takes the stream's end as reached. Reading back a stream
// of 50,000 messages here, no gap between two deliveries passed 35ms.
const streamQuiet = 500 * time.Millisecond

// ReadStream reads the stream queue from `from` to its end, in offset order,
// calling each for every message until each returns false. from is what
// x-stream-offset takes: "first", "next", an int64 offset, or a time.Time
// (resolved to a chunk, so reading may start a little before it).
//
// AMQP 0.9.1 does not tell a stream reader where the stream ends (the message
// count a queue declaration returns is 0 for a stream), so the end is found
// in one of two ways. A second consumer attached at "next" before the read
// starts sees the first message appended after it: once the reader reaches
// that offset it has seen everything that was there when it began, which
// ends a read while other publishers keep appending. When nothing is
// appended, the end is reached when the reader, holding credit, receives
// nothing for streamQuiet. A broker stalled for longer than that in the
// middle of a stream ends the read early: callers must treat "not seen" as
// "not known to be there", never as proof.
//
// The read has a channel of its own, closed when it returns.
func ReadStream(ctx context.Context, conn *amqp.Connection, queue string, from any, each func(*amqp.Delivery) bool) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("read %s: %w", queue, err)
	}
	// RabbitMQ 3.10 keeps counting a stream consumer whose channel closes
	// without cancelling it, until the connection closes: one more for every
	// read. A read cancels its consumers, then closes its channel — only
	// consumers that exist: cancelling one the broker already cancelled (its
	// stream was deleted) fails the whole connection (541 INTERNAL_ERROR).
	afterTag, msgsTag := nextReaderTag(), nextReaderTag()
	var live sync.Map // consumer tag → true while it may be cancelled
	gone := ch.NotifyCancel(make(chan string, 2))
	end := sync.OnceFunc(func() {
		for drained := false; !drained; {
			select {
			case tag := <-gone:
				live.Delete(tag)
			default:
				drained = true
			}
		}
		for _, tag := range []string{msgsTag, afterTag} {
			if _, ok := live.Load(tag); ok {
				_ = ch.Cancel(tag, false)
			}
		}
		_ = ch.Close()
	})
	defer endBounded(end, queue)
	// amqp091-go's consume takes no context: ending the channel is what
	// ends a call the broker does not answer.
	stop := context.AfterFunc(ctx, end)
	defer stop()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(streamPrefetch, 0, false); err != nil {
		return fmt.Errorf("read %s: %w", queue, err)
	}
	after, err := ch.Consume(queue, afterTag, false, false, false, false, amqp.Table{streamOffsetArg: "next"})
	if err != nil {
		return fmt.Errorf("read %s: %w", queue, explainStream(err))
	}
	live.Store(afterTag, true)
	msgs, err := ch.Consume(queue, msgsTag, false, false, false, false, amqp.Table{streamOffsetArg: from})
	if err != nil {
		return fmt.Errorf("read %s from %v: %w", queue, from, explainStream(err))
	}
	live.Store(msgsTag, true)
	var (
		bound          int64 = -1 // offset of the first message appended after the start
		next           int64 = -1 // offset after the last message read
		held           int        // deliveries not yet acked
		lastTag, acked uint64
	)
	// Acks give credit back, nothing else; one multiple ack covers both
	// consumers, whose tags share the channel. The two are read in any
	// order, so a tag can come after a higher one was acked: acking a tag
	// twice would close the channel.
	credit := func(tag uint64) {
		lastTag = max(lastTag, tag)
		if held++; held >= streamPrefetch/4 && lastTag > acked {
			_ = ch.Ack(lastTag, true)
			acked, held = lastTag, 0
		}
	}
	quiet := time.NewTimer(streamQuiet)
	defer quiet.Stop()
	closedErr := func(err *amqp.Error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			// The library tells the listeners why before it closes the
			// delivery channels.
			select {
			case err = <-closed:
			default:
			}
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", queue, err)
		}
		return fmt.Errorf("read %s: channel closed", queue)
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-closed:
			return closedErr(err)
		case d, ok := <-after:
			if !ok {
				live.Delete(afterTag)
				return closedErr(nil)
			}
			credit(d.DeliveryTag)
			if bound < 0 {
				bound = streamOffset(&d)
			}
			if bound >= 0 && next >= bound {
				return nil
			}
		case d, ok := <-msgs:
			if !ok {
				live.Delete(msgsTag)
				return closedErr(nil)
			}
			credit(d.DeliveryTag)
			next = streamOffset(&d) + 1
			if !each(&d) {
				return nil
			}
			if bound >= 0 && next >= bound {
				return nil
			}
			quiet.Reset(streamQuiet)
		case <-quiet.C:
			return nil
		}
	}
}

// readerTags numbers stream readers' consumer tags, which a read needs to
// cancel its consumers.
var readerTags atomic.Uint64

func nextReaderTag() string { return fmt.Sprintf("handoff-stream-reader-%d", readerTags.Add(1)) }

// streamCloseWait bounds how long a stream read waits for the broker to
// confirm the end of its consumers and channel.
const streamCloseWait = 5 * time.Second

// endBounded runs end (cancel the reader's consumers, close its channel),
// waiting at most streamCloseWait for it. Under load a broker has been seen
// to leave such a close unanswered for good: the read must still return
// (its caller may hold what others wait for), and the close goes on
// waiting in the background until the connection ends.
func endBounded(end func(), queue string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		end()
	}()
	t := time.NewTimer(streamCloseWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		slog.Warn("rabbitmq: a stream reader's close is not confirmed; leaving it to the connection", "queue", queue, "waited", streamCloseWait)
	}
}

// streamOffset is a stream delivery's offset, or -1.
func streamOffset(d *amqp.Delivery) int64 {
	if v, ok := d.Headers[streamOffsetArg].(int64); ok {
		return v
	}
	return -1
}

// explainStream turns the broker's refusal of a stream reader into advice.
func explainStream(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed && strings.Contains(ae.Reason, streamOffsetArg) {
		return fmt.Errorf("not a stream (%w)", err)
	}
	return explain(err)
}

// queueKind is what a queue is, as far as the dead-letter topology cares.
type queueKind int

const (
	queueMissing queueKind = iota
	queueStream
	queueOther // a quorum or classic queue
)

// inspectQueue tells whether name exists and whether it is a stream, and for
// a queue that is not, its type as the broker names it ("quorum",
// "classic"). A passive declaration says whether it exists but not its type;
// a consumer with x-stream-offset tells the type, since only a stream takes
// that argument (a quorum or classic queue refuses it with 406 and closes the
// channel). Neither creates anything. Each has a channel of its own.
func inspectQueue(conn *amqp.Connection, name string) (queueKind, string, error) {
	err := onChannel(conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		return err
	})
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return queueMissing, "", nil
	}
	if err != nil {
		return queueMissing, "", err
	}
	err = onChannel(conn, func(ch *amqp.Channel) error {
		if err := ch.Qos(1, 0, false); err != nil {
			return err
		}
		tag := consumerTag(name + ".probe")
		if _, err := ch.Consume(name, tag, false, false, false, false, amqp.Table{streamOffsetArg: "next"}); err != nil {
			return err
		}
		return ch.Cancel(tag, false)
	})
	switch {
	case err == nil:
		return queueStream, "stream", nil
	case errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed && strings.Contains(ae.Reason, streamOffsetArg):
		// "... of queue type rabbit_quorum_queue"
		typ := "non-stream"
		if _, after, ok := strings.Cut(ae.Reason, "queue type rabbit_"); ok {
			typ = strings.TrimSuffix(after, "_queue")
		}
		return queueOther, typ, nil
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		return queueMissing, "", nil
	default:
		return queueMissing, "", err
	}
}
