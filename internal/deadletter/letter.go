package deadletter

import (
	"strconv"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// Letter is one dead letter as the index holds it: the evidence read from
// its DLQ entry, and the state derived from its ledger records. The body is
// not kept here (it may hold personal data, and stays in the DLQ, whose
// retention bounds it); showing it reads the DLQ at the letter's position.
type Letter struct {
	ID     ID     `json:"-"`
	Source string `json:"source"`
	State  State  `json:"state"`
	// Seen says the DLQ entry was read. A letter that only ledger records
	// named so far (the ledger was read further than the DLQ, or the entry
	// was removed before this index read it) has no evidence.
	Seen bool `json:"seen,omitempty"`

	EventID    string `json:"event_id,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Error      string `json:"error,omitempty"`
	ErrorClass string `json:"error_class,omitempty"`
	Attempts   int    `json:"attempts,omitempty"`
	Origin     string `json:"origin,omitempty"`
	// ReplayID is set when the dead letter is itself a replayed copy that
	// failed again.
	ReplayID string `json:"replay_id,omitempty"`
	// ReplayOf is, on such a copy, the dead letter it replayed.
	ReplayOf string `json:"replay_of,omitempty"`
	// Successor is, once a replay of this letter failed again, the new dead
	// letter that replayed copy became.
	Successor      string         `json:"successor,omitempty"`
	FirstFailureAt time.Time      `json:"first_failure_at,omitzero"`
	DeadLetteredAt time.Time      `json:"dead_lettered_at,omitzero"`
	ContentType    string         `json:"content_type,omitempty"`
	Key            []byte         `json:"key,omitempty"`
	BodySize       int            `json:"body_size"`
	Headers        broker.Headers `json:"headers,omitempty"`

	// History is every ledger record applied to the letter, in ledger
	// order, and the expiry if retention closed it.
	History []Record `json:"history,omitempty"`
	// Failure is the FailReplay a later DLQ entry (a replayed copy that
	// failed again) implies, kept until it is legal: the index may read that
	// entry before the ledger records that approved and replayed this one.
	Failure *Record `json:"failure,omitempty"`
}

// Open reports whether the letter is not closed yet.
func (l *Letter) Open() bool { return !l.State.Closed() }

// Approval is the record that approved the letter last, or nil: a replay
// takes its repaired body from it.
func (l *Letter) Approval() *Record {
	for i := len(l.History) - 1; i >= 0; i-- {
		if l.History[i].Transition == Approve {
			return &l.History[i]
		}
	}
	return nil
}

// fill copies a DLQ entry's evidence into l. The handoff-* headers are
// read leniently: a copy missing some is still a dead letter, shown with
// what it has.
func (l *Letter) fill(at time.Time, m *broker.Message) {
	h := m.Headers
	l.Seen = true
	l.EventID = h[broker.HeaderEventID]
	l.Reason = h[broker.HeaderDeadReason]
	l.Error = h[broker.HeaderError]
	l.ErrorClass = h[broker.HeaderErrorClass]
	l.Origin = h[broker.HeaderOrigin]
	l.ReplayID = h[broker.HeaderReplayID]
	l.ReplayOf = h[broker.HeaderReplayOf]
	l.Attempts, _ = strconv.Atoi(h[broker.HeaderAttempt])
	if t, err := broker.ParseTime(broker.HeaderFirstFailureAt, h[broker.HeaderFirstFailureAt]); err == nil {
		l.FirstFailureAt = t
	}
	// at is the log's time for the entry; an AMQP 0.9.1 reader of a RabbitMQ
	// stream gets none, only the timestamp property the copy kept from the
	// original. The engine writes when it made the copy in a header.
	l.DeadLetteredAt = at.UTC()
	if t, err := broker.ParseTime(broker.HeaderDeadLetteredAt, h[broker.HeaderDeadLetteredAt]); err == nil {
		l.DeadLetteredAt = t.UTC()
	}
	l.ContentType = m.ContentType
	l.Key = m.Key
	l.BodySize = len(m.Body)
	l.Headers = h
}
