package deadletter

import "errors"

var (
	// ErrIllegal is matched (errors.Is) by every *IllegalError: returned when
	// a transition is not allowed from a dead letter's state.
	ErrIllegal = errors.New("illegal transition")
	// ErrNotFound is returned when the index holds no dead letter with an id.
	ErrNotFound = errors.New("no such dead letter")
	// ErrBadID is returned when a string is not a dead-letter id.
	ErrBadID = errors.New("not a dead-letter id")
	// ErrVersion is returned when a ledger record has a version this reader
	// does not know: it was written by a newer sidecar.
	ErrVersion = errors.New("unknown ledger record version")
	// ErrUnknownKind is returned for a ledger record of a kind this reader
	// does not know; readers skip it, so a newer sidecar can add kinds.
	ErrUnknownKind = errors.New("unknown ledger record kind")
	// ErrBadRecord is returned when a ledger record cannot be read or breaks
	// a rule every record keeps.
	ErrBadRecord = errors.New("bad ledger record")
	// ErrLost is returned when a transition was appended to the ledger but
	// another replica's record for the same dead letter came first and made
	// it illegal: the ledger's order decides.
	ErrLost = errors.New("transition lost to a concurrent one")
)
