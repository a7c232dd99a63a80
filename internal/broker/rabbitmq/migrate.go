package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrMigrationBusy is returned when another sidecar holds the lock on moving
// the same dead-letter queue into a stream; the connection is retried.
var ErrMigrationBusy = errors.New("rabbitmq: another sidecar is moving the dead-letter queue into a stream")

// migratingQueue is the stream that holds a dead-letter queue's messages
// while the queue is replaced by a stream of the same name.
func migratingQueue(q string) string { return DeadLetterQueue(q) + ".migrating" }

// migrationLock is the exclusive queue whose holder alone moves q's dead
// letters. The broker deletes it with its connection, so a crashed holder
// never keeps it.
func migrationLock(q string) string { return migratingQueue(q) + ".lock" }

// migrationEndHeader marks the message a migration appends to
// Q.dlq.migrating to know where that stream ends: nobody else writes there,
// so reading up to its own marker is reading all of it. Markers are never
// copied into Q.dlq.
const migrationEndHeader = "handoff-migration-end"

// migrateBatch is how many messages a migration publishes before it waits for
// their confirms.
const migrateBatch = 256

// migrateTimeout bounds one migration; a longer one is resumed by the next
// connection.
const migrateTimeout = 10 * time.Minute

// idleWait bounds how long deleteOld waits for the old queue's count of
// consumers to come down once its messages are acked.
const idleWait = 5 * time.Second

// migrationStep names the points a migration can be stopped at by a fault,
// after the work its name says and before the next.
type migrationStep int

const (
	// stepMoved: a batch of copies confirmed in Q.dlq.migrating, not yet
	// acked from the old Q.dlq.
	stepMoved migrationStep = iota + 1
	// stepDrained: the old Q.dlq is empty, not yet deleted.
	stepDrained
	// stepDeleted: the old Q.dlq is deleted, the stream not yet declared.
	stepDeleted
	// stepCopiedBack: a batch of copies confirmed in the stream Q.dlq.
	stepCopiedBack
	// stepCopiedAll: every message is in the stream Q.dlq, Q.dlq.migrating
	// not yet deleted.
	stepCopiedAll
)

func (s migrationStep) String() string {
	return [...]string{"", "moved", "drained", "deleted", "copied-back", "copied-all"}[s]
}

// declareDeadLetter makes sure Q.dlq is a stream. With Declare it declares
// the stream, and moves a Q.dlq of another type (a quorum queue an earlier
// version declared) into one, or finishes such a move a crash interrupted.
// Without Declare it only checks, and says what is wrong.
func (t Topology) declareDeadLetter(ctx context.Context, conn *amqp.Connection) error {
	dlq, tmp := DeadLetterQueue(t.Queue), migratingQueue(t.Queue)
	if !t.Declare {
		kind, typ, err := inspectQueue(conn, dlq)
		switch {
		case err != nil:
			return fmt.Errorf("dead-letter stream %q: %w", dlq, explain(err))
		case kind == queueMissing:
			return fmt.Errorf("dead-letter stream %q does not exist; with declare: false declare it yourself as a stream (x-queue-type: stream)", dlq)
		case kind == queueOther:
			return fmt.Errorf("%q is a %s queue, not a stream; declare it as a stream (x-queue-type: stream), or start once with declare: true, which moves its dead letters into one", dlq, typ)
		}
		if kind, _, err := inspectQueue(conn, tmp); err == nil && kind != queueMissing {
			return fmt.Errorf("%q exists: a move of %q into a stream was interrupted; start once with declare: true to finish it", tmp, dlq)
		}
		return nil
	}
	err := onChannel(conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(dlq, true, false, false, false, streamArgs(t.DeadLetterRetention))
		return err
	})
	if err != nil {
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
			return fmt.Errorf("dead-letter stream %q: %w", dlq, explain(err))
		}
		kind, _, ierr := inspectQueue(conn, dlq)
		if ierr != nil {
			return fmt.Errorf("dead-letter stream %q: %w", dlq, explain(ierr))
		}
		switch kind {
		case queueOther:
			return t.migrate(ctx, conn)
		case queueStream:
			// Retention is the operator's to change (with a policy); a
			// stream is never redeclared to do it.
			t.logger().Warn("the dead-letter stream's arguments differ from the configuration; it is used as it is",
				"stream", dlq, "broker", ae.Reason)
		default:
			return fmt.Errorf("dead-letter stream %q: %w", dlq, explain(err))
		}
	}
	kind, _, err := inspectQueue(conn, tmp)
	if err != nil {
		return fmt.Errorf("queue %q: %w", tmp, explain(err))
	}
	if kind != queueMissing {
		return t.migrate(ctx, conn)
	}
	return nil
}

func (t Topology) logger() *slog.Logger {
	if t.Logger == nil {
		return slog.Default()
	}
	return t.Logger
}

// migrate moves the dead letters of a Q.dlq that is not a stream into the
// stream Q.dlq. RabbitMQ cannot rename a queue or change its type, so the
// messages go twice: into the stream Q.dlq.migrating, then, once the old
// queue is deleted and the stream Q.dlq declared, back into Q.dlq. Every step
// looks at what is there and does only what is left, so a migration stopped
// anywhere is finished by the next one:
//
//  1. Q.dlq is not a stream: declare Q.dlq.migrating; take each message from
//     Q.dlq and publish it to Q.dlq.migrating, acking it only once its copy
//     is confirmed; when Q.dlq is empty and nobody consumes it, delete it.
//  2. Q.dlq is missing: declare it as a stream.
//  3. Q.dlq.migrating exists: copy each of its messages into Q.dlq, then
//     delete it.
//
// A crash between a confirm and its ack in step 1 hands the message back to
// Q.dlq, flagged redelivered, with its copy already moved: a redelivered
// message whose copy Q.dlq.migrating holds is acked without a second one. In
// step 3 a message whose copy the stream Q.dlq already holds is not copied
// again. Copies are recognised by body, properties and headers; two
// byte-identical dead letters (the same copy published twice) may so become
// one after a crash in step 1, never none.
//
// One sidecar migrates at a time: each holds an exclusive queue as a lock,
// and another finds it taken (ErrMigrationBusy) and retries later.
func (t Topology) migrate(ctx context.Context, conn *amqp.Connection) error {
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	dlq, tmp, lock := DeadLetterQueue(t.Queue), migratingQueue(t.Queue), migrationLock(t.Queue)
	err := onChannel(conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(lock, false, true, true, false, nil)
		return err
	})
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.ResourceLocked {
		return fmt.Errorf("%s: %w", dlq, ErrMigrationBusy)
	}
	if err != nil {
		return fmt.Errorf("lock %q: %w", lock, explain(err))
	}
	defer func() {
		_ = onChannel(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(lock, false, false, false)
			return err
		})
	}()
	m := &migration{t: t, conn: conn, log: t.logger().With("queue", dlq, "via", tmp)}
	m.log.Info("moving the dead-letter queue into a stream")
	if err := m.run(ctx); err != nil {
		m.log.Warn("moving the dead-letter queue into a stream stopped; the next connection goes on",
			"moved", m.moved, "already_moved", m.skippedIn, "copied_back", m.copied, "already_copied", m.skippedBack, "err", err)
		return fmt.Errorf("move %q into a stream: %w", dlq, err)
	}
	m.log.Info("the dead-letter queue is a stream now",
		"moved", m.moved, "already_moved", m.skippedIn, "copied_back", m.copied, "already_copied", m.skippedBack,
		"headers_as_text", m.converted)
	return nil
}

type migration struct {
	t    Topology
	conn *amqp.Connection
	log  *slog.Logger

	moved, skippedIn    int // step 1: copied into tmp; acked as already there
	copied, skippedBack int // step 3: copied into dlq; already there
	converted           int // messages with header values kept as text
}

func (m *migration) fault(step migrationStep, n int) error {
	if m.t.fault == nil {
		return nil
	}
	return m.t.fault(step, n)
}

func (m *migration) batch() int {
	if m.t.moveBatch > 0 {
		return m.t.moveBatch
	}
	return migrateBatch
}

func (m *migration) run(ctx context.Context) error {
	dlq, tmp := DeadLetterQueue(m.t.Queue), migratingQueue(m.t.Queue)
	kind, typ, err := inspectQueue(m.conn, dlq)
	if err != nil {
		return err
	}
	if kind == queueOther {
		m.log.Info("moving the dead letters out of the old queue", "type", typ)
		if err := m.declareStream(tmp); err != nil {
			return err
		}
		for try := 1; ; try++ {
			if err := m.moveOut(ctx); err != nil {
				return err
			}
			if err := m.fault(stepDrained, 0); err != nil {
				return err
			}
			err := m.deleteOld()
			if errors.Is(err, errNotEmpty) && try < 3 {
				continue
			}
			if err != nil {
				return err
			}
			break
		}
		if err := m.fault(stepDeleted, 0); err != nil {
			return err
		}
	}
	if err := m.declareStream(dlq); err != nil {
		return err
	}
	if kind, _, err := inspectQueue(m.conn, dlq); err != nil || kind != queueStream {
		// An earlier version's reconnect declared it again in between.
		return fmt.Errorf("%q is not a stream after it was declared as one (%v); is an earlier version still running?", dlq, err)
	}
	if kind, _, err := inspectQueue(m.conn, tmp); err != nil || kind == queueMissing {
		return err
	}
	if err := m.copyBack(ctx); err != nil {
		return err
	}
	if err := m.fault(stepCopiedAll, 0); err != nil {
		return err
	}
	return onChannel(m.conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(tmp, false, false, false)
		return err
	})
}

// declareStream declares name as a dead-letter stream; one that exists with
// other arguments (a changed retention) is used as it is.
func (m *migration) declareStream(name string) error {
	err := onChannel(m.conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(name, true, false, false, false, streamArgs(m.t.DeadLetterRetention))
		return err
	})
	if err == nil {
		return nil
	}
	if kind, _, ierr := inspectQueue(m.conn, name); ierr == nil && kind == queueStream {
		return nil
	}
	return fmt.Errorf("declare stream %q: %w", name, explain(err))
}

// fingerprints counts the messages of Q.dlq by fingerprint. Its end is found
// as ReadStream finds it: an end taken too early means a copy made twice,
// never one lost.
func (m *migration) fingerprints(ctx context.Context) (map[[32]byte]int, error) {
	seen := map[[32]byte]int{}
	err := ReadStream(ctx, m.conn, DeadLetterQueue(m.t.Queue), "first", func(d *amqp.Delivery) bool {
		seen[fingerprint(publishingOf(d))]++
		return true
	})
	return seen, err
}

// readMigrating reads all of Q.dlq.migrating, markers left out. It appends
// a marker of its own first and reads up to it, so that the end is known, not
// guessed: what is deleted after being copied must have been read.
func (m *migration) readMigrating(ctx context.Context, pub *publisher, each func(*amqp.Delivery) bool) error {
	tmp := migratingQueue(m.t.Queue)
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	if err := pub.publish(ctx, tmp, amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		Headers:      amqp.Table{migrationEndHeader: id},
	}); err != nil {
		return fmt.Errorf("mark the end of %q: %w", tmp, err)
	}
	reached := false
	err := ReadStream(ctx, m.conn, tmp, "first", func(d *amqp.Delivery) bool {
		if v, ok := d.Headers[migrationEndHeader]; ok {
			reached = v == id
			return !reached
		}
		return each(d)
	})
	switch {
	case err != nil:
		return err
	case !reached && ctx.Err() == nil:
		// each stopped the read, or the broker stalled past streamQuiet.
		return errStopped
	}
	return ctx.Err()
}

// errStopped is returned by readMigrating when the read ended before the
// marker.
var errStopped = errors.New("stopped before the end of the stream")

// errNotEmpty is returned by deleteOld when messages arrived in the old
// queue after it was emptied: it is emptied again.
var errNotEmpty = errors.New("not empty")

// moveOut is step 1: every message of the old Q.dlq into Q.dlq.migrating,
// each acked only once its copy is confirmed.
func (m *migration) moveOut(ctx context.Context) error {
	dlq, tmp := DeadLetterQueue(m.t.Queue), migratingQueue(m.t.Queue)
	pub, err := newPublisher(m.conn, func(error) {})
	if err != nil {
		return err
	}
	defer func() { _ = pub.ch.Close(); pub.wait() }()
	seen := map[[32]byte]int{}
	if err := m.readMigrating(ctx, pub, func(d *amqp.Delivery) bool {
		seen[fingerprint(publishingOf(d))]++
		return true
	}); err != nil {
		return err
	}
	ch, err := m.conn.Channel()
	if err != nil {
		return err
	}
	// Closing the channel hands back whatever was taken and not acked.
	defer func() { _ = ch.Close() }()
	for batch := 1; ; batch++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		var (
			waits   []func(context.Context) error
			lastTag uint64
			empty   bool
		)
		for len(waits) < m.batch() {
			d, ok, err := ch.Get(dlq, false)
			if err != nil {
				return fmt.Errorf("take from %q: %w", dlq, err)
			}
			if !ok {
				empty = true
				break
			}
			lastTag = d.DeliveryTag
			p := publishingOf(&d)
			if fp := fingerprint(p); d.Redelivered && seen[fp] > 0 {
				// Its copy was confirmed before a crash took the ack.
				seen[fp]--
				m.skippedIn++
				continue
			}
			if !sameHeaders(d.Headers, p.Headers) {
				m.converted++
			}
			wait, err := pub.start(ctx, tmp, p)
			if err != nil {
				return err
			}
			waits = append(waits, wait)
		}
		for _, wait := range waits {
			if err := wait(ctx); err != nil {
				return err
			}
		}
		if err := m.fault(stepMoved, batch); err != nil {
			return err
		}
		if lastTag != 0 {
			// Ack only after the copies are confirmed: acking first loses
			// them on a crash.
			if err := ch.Ack(lastTag, true); err != nil {
				return fmt.Errorf("ack in %q: %w", dlq, err)
			}
		}
		m.moved += len(waits)
		if empty {
			return nil
		}
	}
}

// sameHeaders reports whether a copy kept every header of the original
// unchanged, broker headers aside.
func sameHeaders(orig, copied amqp.Table) bool {
	for k, v := range copied {
		if s, ok := v.(string); ok {
			if o, ok := orig[k].(string); !ok || o != s {
				return false
			}
		}
	}
	return true
}

// deleteOld deletes the emptied old Q.dlq. Quorum queues refuse the
// if-empty and if-unused flags, so emptiness is checked just before.
func (m *migration) deleteOld() error {
	dlq := DeadLetterQueue(m.t.Queue)
	var (
		st  amqp.Queue
		err error
	)
	// A quorum queue applies acks asynchronously, and counts the messages
	// taken with basic.get as consumers until then: give it a moment.
	for wait := time.Now().Add(idleWait); ; time.Sleep(50 * time.Millisecond) {
		err = onChannel(m.conn, func(ch *amqp.Channel) error {
			var err error
			st, err = ch.QueueDeclarePassive(dlq, true, false, false, false, nil)
			return err
		})
		if err != nil || st.Consumers == 0 || time.Now().After(wait) {
			break
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("inspect %q: %w", dlq, explain(err))
	case st.Consumers > 0:
		return fmt.Errorf("%q has %d consumers, whose unacked dead letters the move cannot see; stop them", dlq, st.Consumers)
	case st.Messages > 0:
		return fmt.Errorf("%q received %d messages while it was emptied: %w", dlq, st.Messages, errNotEmpty)
	}
	var lost int
	err = onChannel(m.conn, func(ch *amqp.Channel) error {
		var err error
		lost, err = ch.QueueDelete(dlq, false, false, false)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete %q: %w", dlq, explain(err))
	}
	if lost > 0 {
		// Published in the instant between the check and the delete, by
		// a sidecar of the earlier version still running.
		m.log.Error("dead letters published into the old queue as it was deleted are lost", "count", lost)
	}
	m.log.Info("the old dead-letter queue is deleted", "moved", m.moved, "already_moved", m.skippedIn)
	return nil
}

// copyBack is step 3: every message of Q.dlq.migrating into the stream Q.dlq,
// but for those a stopped earlier copy already put there.
func (m *migration) copyBack(ctx context.Context) error {
	dlq := DeadLetterQueue(m.t.Queue)
	seen, err := m.fingerprints(ctx)
	if err != nil {
		return err
	}
	pub, err := newPublisher(m.conn, func(error) {})
	if err != nil {
		return err
	}
	defer func() { _ = pub.ch.Close(); pub.wait() }()
	var (
		waits []func(context.Context) error
		batch int
		fail  error
	)
	flush := func() error {
		for _, wait := range waits {
			if err := wait(ctx); err != nil {
				return err
			}
		}
		m.copied += len(waits)
		waits = waits[:0]
		batch++
		return m.fault(stepCopiedBack, batch)
	}
	err = m.readMigrating(ctx, pub, func(d *amqp.Delivery) bool {
		p := publishingOf(d)
		if fp := fingerprint(p); seen[fp] > 0 {
			seen[fp]--
			m.skippedBack++
			return true
		}
		wait, err := pub.start(ctx, dlq, p)
		if err != nil {
			fail = err
			return false
		}
		if waits = append(waits, wait); len(waits) >= m.batch() {
			fail = flush()
		}
		return fail == nil
	})
	if fail != nil {
		return fail
	}
	if err != nil {
		return err
	}
	return flush()
}
