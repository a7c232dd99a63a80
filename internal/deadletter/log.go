package deadletter

import (
	"context"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// ReadFunc is called for each message a Log reads: its partition
// (NoPartition on a RabbitMQ stream), its offset, the time the broker
// stored it, and the message. An error from it stops the read with it.
type ReadFunc = func(partition int32, offset int64, at time.Time, m *broker.Message) error

// Log is one log in the broker, read from offsets: the DLQ (Q.dlq stream,
// T.G.dlq topic) or the ledger (Q.dlq.ledger, T.G.dlq.ledger). The broker
// adapters implement it with plain types, so they never import this package.
// Implementations are safe for concurrent use.
type Log interface {
	// Name is the log's name in the broker: a stream or a topic.
	Name() string
	// First returns, per partition, the first offset still in the log:
	// retention moves it. A partition with nothing in it may be left out.
	First(ctx context.Context) (map[int32]int64, error)
	// Read calls each for every message from from[p] to the log's end as
	// it was when Read began, in offset order within a partition. A
	// partition not in from is read from its first offset; an offset below
	// the first reads from the first, one past the end reads nothing.
	Read(ctx context.Context, from map[int32]int64, each ReadFunc) error
}

// LedgerLog is the ledger: a Log that this package also appends to.
type LedgerLog interface {
	Log
	// Append writes one record and returns once the broker confirmed it.
	// An error means the record may or may not be in the log.
	Append(ctx context.Context, body []byte) error
}

// Source is one source's pair of logs, and the name the index files its
// dead letters under (the source's name in the configuration).
type Source struct {
	Name   string
	DLQ    Log
	Ledger LedgerLog
}
