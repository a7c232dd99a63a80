package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
)

// RetryQueue is the work queue that delay tiers dead-letter into.
func RetryQueue(q string) string { return q + ".retry" }

// TierQueue is the delay queue of one tier.
func TierQueue(q string, tier time.Duration) string { return q + ".retry." + broker.TierName(tier) }

// DeadLetterQueue is the dead-letter stream of q.
func DeadLetterQueue(q string) string { return q + ".dlq" }

// Topology is the set of queues derived from one source queue.
type Topology struct {
	Queue string
	Tiers []time.Duration
	// Declare creates what is missing, and moves a dead-letter queue an
	// earlier version declared into a stream; without it every queue must
	// exist, the dead-letter one as a stream.
	Declare bool
	// DeadLetterRetention is the dead-letter stream's x-max-age when the
	// sidecar declares it; zero means DefaultDeadLetterRetention.
	DeadLetterRetention time.Duration
	Logger              *slog.Logger

	// moveBatch is how many messages a migration moves per confirm window;
	// zero means migrateBatch.
	moveBatch int
	// fault, when set, is asked at each step of a migration; an error
	// stops the migration there, as a crash would.
	fault func(step migrationStep, n int) error
}

// queues are the quorum queues of the retry path; the dead-letter stream
// (declareDeadLetter) and then its ledger (declareLedger) are declared after
// them: once the ledger exists, the whole topology does.
func (t Topology) queues() []queueSpec {
	quorum := amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
	specs := []queueSpec{{name: RetryQueue(t.Queue), args: quorum}}
	for _, tier := range t.Tiers {
		specs = append(specs, queueSpec{name: TierQueue(t.Queue, tier), args: amqp.Table{
			amqp.QueueTypeArg: amqp.QueueTypeQuorum,
			// One TTL per queue keeps expiry FIFO: per-message TTLs only
			// expire at the head of a queue.
			amqp.QueueMessageTTLArg:     tier.Milliseconds(),
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": RetryQueue(t.Queue),
			"x-dead-letter-strategy":    "at-least-once",
			amqp.QueueOverflowArg:       amqp.QueueOverflowRejectPublish,
		}})
	}
	return specs
}

type queueSpec struct {
	name string
	args amqp.Table
}

// declare checks the source queue and declares (or checks) the derived ones.
// A failed declaration closes the channel, so each step opens its own.
func (t Topology) declare(ctx context.Context, conn *amqp.Connection) error {
	if err := onChannel(conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(t.Queue, true, false, false, false, nil)
		return err
	}); err != nil {
		return fmt.Errorf("source queue %q: %w", t.Queue, explain(err))
	}
	for _, q := range t.queues() {
		err := onChannel(conn, func(ch *amqp.Channel) error {
			if t.Declare {
				_, err := ch.QueueDeclare(q.name, true, false, false, false, q.args)
				return err
			}
			_, err := ch.QueueDeclarePassive(q.name, true, false, false, false, nil)
			return err
		})
		if err != nil {
			return fmt.Errorf("queue %q: %w", q.name, explain(err))
		}
	}
	if err := t.declareDeadLetter(ctx, conn); err != nil {
		return err
	}
	return t.declareLedger(conn)
}

func onChannel(conn *amqp.Connection, f func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := f(ch); err != nil {
		return err // the broker closed the channel
	}
	return ch.Close()
}

// explain turns the broker's reply codes for declarations into advice.
func explain(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.NotFound:
			return fmt.Errorf("does not exist (%w)", err)
		case amqp.PreconditionFailed:
			return fmt.Errorf("exists with other arguments; delete it or fix the configuration (%w)", err)
		}
	}
	return err
}
