package deadletter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// Change is one transition asked for: by an operator through the admin API
// (Approve, Terminate), by a replay runner (Replay), or by the replica that
// handled a replayed copy (Complete, FailReplay).
type Change struct {
	ID         ID
	Transition Transition
	// Who is the admin token's subject, or the replica's name.
	Who string
	Why string
	// Repair, on Approve only, is the body to replay instead.
	Repair *Repair
	// ReplayID on Replay, Complete and FailReplay.
	ReplayID string
	// Successor, on FailReplay, is the new dead letter.
	Successor ID
}

// Apply records c in src's ledger and returns the letter as it stands once
// the index has read the record back. It refuses, writing nothing, a change
// to a letter the index does not hold (ErrNotFound) or one illegal from its
// state (*IllegalError). When another replica's record for the same letter
// reached the ledger first and made c illegal, c's record stays in the log,
// refused there by every reader, and Apply returns ErrLost.
func (x *Index) Apply(ctx context.Context, src Source, c Change) (Letter, error) {
	// Decide on the latest state: read what others appended first.
	if _, err := x.CatchUp(ctx, src); err != nil {
		return Letter{}, err
	}
	l, err := x.Get(c.ID)
	if err != nil {
		return Letter{}, err
	}
	if c.ID.Log != src.DLQ.Name() {
		return Letter{}, fmt.Errorf("%w: %s is not in %s", ErrNotFound, c.ID, src.DLQ.Name())
	}
	to, err := Decide(l.State, c.Transition)
	if err != nil {
		return l, err
	}
	if c.Transition == Expire {
		return l, &IllegalError{From: l.State, Transition: c.Transition}
	}
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	r := Record{
		Version: RecordVersion, Kind: KindTransition, ID: c.ID.String(),
		Transition: c.Transition, State: to, Who: c.Who, At: x.now().UTC(), Why: c.Why,
		Nonce: hex.EncodeToString(nonce), Repair: c.Repair, ReplayID: c.ReplayID,
	}
	if c.Transition == FailReplay {
		r.Successor = c.Successor.String()
	}
	body, err := r.Encode()
	if err != nil {
		return l, err
	}
	if err := src.Ledger.Append(ctx, body); err != nil {
		return l, fmt.Errorf("append to %s: %w", src.Ledger.Name(), err)
	}
	// Only the ledger changed that matters here: reading it back alone
	// saves a read of the DLQ.
	if err := x.catchUpLedger(ctx, src); err != nil {
		return l, err
	}
	if l, err = x.Get(c.ID); err != nil {
		return l, err
	}
	for i := len(l.History) - 1; i >= 0; i-- {
		if l.History[i].Nonce == r.Nonce {
			return l, nil
		}
	}
	return l, fmt.Errorf("%w: %s is %s", ErrLost, c.ID, l.State)
}
