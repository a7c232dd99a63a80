package deadletter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// RecordVersion is the version of the ledger records this package writes.
const RecordVersion = 1

// KindTransition is the kind of a record that moves one dead letter from one
// state to another. Later kinds (a replay run, its heartbeat) share the log;
// a reader skips a kind it does not know.
const KindTransition = "transition"

// Limits on a record's fields, so that one record stays well under a
// broker's message size limit (RabbitMQ and Kafka both take 1 MiB by
// default) and a decoder never holds more than it must.
const (
	MaxWhoLen      = 256
	MaxWhyLen      = 4096
	MaxRepairBody  = 512 << 10
	maxRecordLen   = 1 << 20
	maxReplayIDLen = 256
	maxIDLen       = 1024
	maxContentType = 256
)

// Record is one ledger record: one transition of one dead letter, with who
// made it (the admin token's subject, or the replica that saw a replayed
// copy's outcome), when and why.
type Record struct {
	Version int    `json:"v"`
	Kind    string `json:"kind"`
	// ID is the dead letter's id (ID.String).
	ID         string     `json:"id"`
	Transition Transition `json:"transition"`
	// State is the state after the transition, as its writer decided it. A
	// reader decides again from the ledger's order (see Index) and trusts
	// its own decision; State lets a person read the log.
	State State     `json:"state"`
	Who   string    `json:"who"`
	At    time.Time `json:"at"`
	Why   string    `json:"why,omitempty"`
	// Nonce tells a writer its own record when it reads the ledger back.
	Nonce string `json:"nonce,omitempty"`
	// Repair is an approval's repaired body, if any.
	Repair *Repair `json:"repair,omitempty"`
	// ReplayID is the replay a Replay, Complete or FailReplay belongs to.
	ReplayID string `json:"replay_id,omitempty"`
	// Successor is, on FailReplay, the new dead letter the replayed copy
	// became.
	Successor string `json:"successor,omitempty"`
}

// Repair is a body to replay instead of the original, which stays in the
// DLQ for audit.
type Repair struct {
	Body        []byte `json:"body"`
	ContentType string `json:"content_type,omitempty"`
	Note        string `json:"note,omitempty"`
}

// Encode writes r as JSON: one object, no trailing newline. It checks r
// with the rules Decode applies, so nothing written is unreadable.
func (r *Record) Encode() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// DecodeRecord reads one ledger record. It returns ErrVersion for a newer
// version, ErrUnknownKind for a kind it does not know (both to be skipped by
// a reader, not failed on) and ErrBadRecord for anything else it cannot
// trust.
func DecodeRecord(b []byte) (Record, error) {
	if len(b) > maxRecordLen {
		return Record{}, fmt.Errorf("%w: %d bytes", ErrBadRecord, len(b))
	}
	// The version and kind first, so that a newer record is recognised
	// even if the rest would not decode here.
	var head struct {
		Version int    `json:"v"`
		Kind    string `json:"kind"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return Record{}, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	switch {
	case head.Version > RecordVersion:
		return Record{}, fmt.Errorf("%w: %d", ErrVersion, head.Version)
	case head.Version < 1:
		return Record{}, fmt.Errorf("%w: version %d", ErrBadRecord, head.Version)
	case head.Kind != KindTransition:
		return Record{}, fmt.Errorf("%w: %.64q", ErrUnknownKind, head.Kind)
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Record{}, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	if dec.More() {
		return Record{}, fmt.Errorf("%w: data after the record", ErrBadRecord)
	}
	if err := r.check(); err != nil {
		return Record{}, err
	}
	return r, nil
}

// check enforces what every record keeps.
func (r *Record) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadRecord}, a...)...)
	}
	if r.Version != RecordVersion || r.Kind != KindTransition {
		return bad("version %d kind %.64q", r.Version, r.Kind)
	}
	if len(r.ID) > maxIDLen {
		return bad("id of %d bytes", len(r.ID))
	}
	if _, err := ParseID(r.ID); err != nil {
		return bad("%v", err)
	}
	if !r.Transition.Valid() || r.Transition == Expire {
		// Expire is derived by every replica, never written.
		return bad("transition %.64q", r.Transition)
	}
	if r.State != target(r.Transition) {
		return bad("%s cannot lead to %.64q", r.Transition, r.State)
	}
	if r.Who == "" || len(r.Who) > MaxWhoLen {
		return bad("who of %d bytes", len(r.Who))
	}
	if r.At.IsZero() {
		return bad("no time")
	}
	if len(r.Why) > MaxWhyLen || len(r.Nonce) > 64 {
		return bad("why or nonce too long")
	}
	if r.Repair != nil {
		if r.Transition != Approve {
			return bad("a repair on %s", r.Transition)
		}
		if len(r.Repair.Body) > MaxRepairBody || len(r.Repair.ContentType) > maxContentType || len(r.Repair.Note) > MaxWhyLen {
			return bad("repair too large")
		}
	}
	switch r.Transition {
	case Replay, Complete, FailReplay:
		if r.ReplayID == "" || len(r.ReplayID) > maxReplayIDLen {
			return bad("%s needs a replay id", r.Transition)
		}
	default:
		if r.ReplayID != "" {
			return bad("a replay id on %s", r.Transition)
		}
	}
	if r.Transition == FailReplay {
		if _, err := ParseID(r.Successor); err != nil || len(r.Successor) > maxIDLen {
			return bad("fail-replay needs its new dead letter's id")
		}
	} else if r.Successor != "" {
		return bad("a successor on %s", r.Transition)
	}
	return nil
}

// target is the state a transition leads to; every transition has one.
func target(t Transition) State {
	for _, to := range legal {
		if s, ok := to[t]; ok {
			return s
		}
	}
	return ""
}
