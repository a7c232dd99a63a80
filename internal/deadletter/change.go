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
//
// It decides on the index as it stands, kept close to the logs by the
// manager's catch-up, and reads the logs first only when the index does not
// know the letter or refuses the change: the ledger's order decides in the
// end, so a stale view costs at most a refused record, never a wrong state.
func (x *Index) Apply(ctx context.Context, src Source, c Change) (Letter, error) {
	l, r, err := x.record(ctx, src, c)
	if err != nil {
		return l, err
	}
	body, err := r.Encode()
	if err != nil {
		return l, err
	}
	if err := x.appendRead(ctx, src, body, r.Nonce); err != nil {
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

// AppendOnly records c in src's ledger as Apply does, and returns once the
// broker confirmed the record, without reading it back: for a writer that
// does not need the outcome of the ledger's order at once (a handled
// replayed copy's Complete, waited for by its ack). The index reads the
// record with its next catch-up.
func (x *Index) AppendOnly(ctx context.Context, src Source, c Change) error {
	_, r, err := x.record(ctx, src, c)
	if err != nil {
		return err
	}
	body, err := r.Encode()
	if err != nil {
		return err
	}
	if err := src.Ledger.Append(ctx, body); err != nil {
		return fmt.Errorf("append to %s: %w", src.Ledger.Name(), err)
	}
	return nil
}

// record decides c on the index's view, reading the logs first only when
// the index does not know the letter or refuses the change, and returns
// the record to append.
func (x *Index) record(ctx context.Context, src Source, c Change) (Letter, Record, error) {
	if c.ID.Log != src.DLQ.Name() {
		return Letter{}, Record{}, fmt.Errorf("%w: %s is not in %s", ErrNotFound, c.ID, src.DLQ.Name())
	}
	if c.Transition == Expire {
		return Letter{}, Record{}, &IllegalError{From: "", Transition: c.Transition}
	}
	l, to, err := x.decide(c)
	if err != nil {
		// Read what others appended, and decide again on that.
		if _, cerr := x.CatchUp(ctx, src); cerr != nil {
			return Letter{}, Record{}, cerr
		}
		if l, to, err = x.decide(c); err != nil {
			return l, Record{}, err
		}
	}
	r := Record{
		Version: RecordVersion, Kind: KindTransition, ID: c.ID.String(),
		Transition: c.Transition, State: to, Who: c.Who, At: x.now().UTC(), Why: c.Why,
		Nonce: newNonce(), Repair: c.Repair, ReplayID: c.ReplayID,
	}
	if c.Transition == FailReplay {
		r.Successor = c.Successor.String()
	}
	return l, r, nil
}

// decide is c's target state on the index's view.
func (x *Index) decide(c Change) (Letter, State, error) {
	l, err := x.Get(c.ID)
	if err != nil {
		return l, "", err
	}
	if !l.Seen {
		// Only ledger records named it so far: its DLQ entry is not read.
		return l, "", fmt.Errorf("%w: %s", ErrNotFound, c.ID)
	}
	to, err := Decide(l.State, c.Transition)
	if _, late := lateReplay(&l, c.Transition, c.ReplayID); err != nil && late {
		// Recorded after the outcome it precedes, the state left as it is.
		return l, l.State, nil
	}
	return l, to, err
}

// appendRead appends one record to src's ledger, confirmed, and reads the
// ledger into the index up to it.
func (x *Index) appendRead(ctx context.Context, src Source, body []byte, nonce string) error {
	if err := src.Ledger.Append(ctx, body); err != nil {
		return fmt.Errorf("append to %s: %w", src.Ledger.Name(), err)
	}
	return x.catchUpLedger(ctx, src, nonce)
}

// newNonce tells a writer its own record when it reads the ledger back.
func newNonce() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
