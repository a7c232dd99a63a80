package dispatch

import (
	"context"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
)

// Source yields deliveries. Consume calls deliver from one goroutine for each
// delivery until ctx is done, then returns; deliver may block, which is how
// the engine holds intake back. Deliveries handed out stay settleable after
// Consume returns, until the adapter is closed.
type Source interface {
	Consume(ctx context.Context, deliver func(broker.Delivery)) error
}

// Transferer moves copies to a source's retry tiers and dead-letter
// destination. Transfer returns nil only once the broker has durably taken the
// copy. It is safe for concurrent use.
type Transferer interface {
	Transfer(ctx context.Context, dest broker.Destination, msg *broker.Message, trail broker.Headers) error
}

// CopyFinder is what a Transferer whose destinations can be read back (Kafka
// topics, RabbitMQ streams) also offers: after a crash between publishing a
// copy and recording its confirm, the copy is looked for rather than
// published a second time.
type CopyFinder interface {
	// FindCopy reports whether a copy with trail's event id, replay id and
	// hop reached dest, written since about since.
	FindCopy(ctx context.Context, dest broker.Destination, trail broker.Headers, since time.Time) (bool, error)
}

// RetryHolder is a Source whose retries arrive on the same intake as fresh
// messages (Kafka's one poll loop): it stops fetching retries while the retry
// budget is spent, so that waiting retries do not crowd out fresh messages.
type RetryHolder interface {
	HoldRetries(hold bool)
}

// Deliverer calls the app. It is safe for concurrent use.
type Deliverer interface {
	// Deliver makes one attempt; every ending is a classified Result.
	Deliver(ctx context.Context, r *handler.Request) handler.Result
	// Probe reports whether the app accepts connections.
	Probe(ctx context.Context) error
}

// asyncDeliverer is a Deliverer that can also take a call without a
// goroutine waiting on it, and tell its answer later: handler.Batcher.
type asyncDeliverer interface {
	DeliverThen(ctx context.Context, r *handler.Request, then handler.Then)
}

// Journal records each state change of a hand-off and answers what it knows
// of one. It is safe for concurrent use.
type Journal interface {
	// State is everything recorded for k.
	State(k journal.Key) (journal.State, error)
	// Append returns once recs are durable.
	Append(ctx context.Context, k journal.Key, recs ...journal.Record) error
	// AppendAsync queues recs without waiting: for records whose loss in a
	// crash costs a line of history, never a message.
	AppendAsync(k journal.Key, recs ...journal.Record)
	// Probe commits nothing and says whether the journal can be written:
	// after journal.ErrNoRoom, nil means it can again.
	Probe(ctx context.Context) error
}

// laterJournal is a Journal that can call back once records are durable
// (journal.Journal.AppendThen), so that a walk need not park waiting.
type laterJournal interface {
	AppendThen(k journal.Key, then journal.Then, recs ...journal.Record)
}

// Route is one configured source: its intakes (the source itself and the
// retry queue or topics, which may share one consumer) and the transferer for
// its copies.
type Route struct {
	Name string
	// System is the broker, rabbitmq or kafka, and Destination the queue
	// or topic: a span's messaging attributes.
	System, Destination string
	Sources             []Source
	Transfer            Transferer
	// CESource is the ce-source given to messages that carry none.
	CESource string
	// InPlace retries a failed message where it is — the delivery stays
	// unsettled and the walk waits until the retry is due — instead of
	// moving it to a delay tier: for ordered consumption, where a later
	// message must not overtake it.
	InPlace bool
	// RetriesShareIntake: the route's retries come through the same
	// Consume as its fresh messages, so admission never blocks on the
	// retry budget (that would hold fresh messages too); a RetryHolder
	// source stops fetching retries instead.
	RetriesShareIntake bool
}

// Observer is told what the engine does, for metrics: each message taken,
// each attempt's outcome and latency, each copy moved to a retry tier or the
// dead-letter destination (once its broker confirmed it), each redelivery
// settled from the journal. Its methods are called on the goroutine that
// carries the hand-off at the time (its own, or the sender of the batch
// its call went in, see handoff.Answered): they must be cheap and safe for
// concurrent use.
type Observer interface {
	// Received: retry says the message is a retry copy, not one taken
	// from the source's own backlog.
	Received(route string, retry bool)
	// Attempted: first says the attempt was the message's first.
	Attempted(route, outcome string, first bool, took time.Duration)
	Retried(route, tier string)
	DeadLettered(route, reason string)
	Duplicate(route string)
}

// noObserver is the Observer of an engine given none.
type noObserver struct{}

func (noObserver) Received(string, bool)                         {}
func (noObserver) Attempted(string, string, bool, time.Duration) {}
func (noObserver) Retried(string, string)                        {}
func (noObserver) DeadLettered(string, string)                   {}
func (noObserver) Duplicate(string)                              {}
