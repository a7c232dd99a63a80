package journal

import (
	"time"

	bolt "go.etcd.io/bbolt"
)

// State is what the journal knows of a hand-off: enough for dispatch to tell
// a redelivery it has already dealt with from new work.
type State struct {
	Found bool
	// Hop is the latest hop received.
	Hop            int
	FirstAttemptAt time.Time
	// Attempts is the highest attempt number started.
	Attempts int
	// HopAttempt is the attempt started in hop Hop (0: none); HopOutcome its
	// outcome (0: none recorded — the call was cut off).
	HopAttempt int
	HopOutcome uint8
	HopDetail  string
	// HopAlone: attempt HopAttempt was made alone (its ATTEMPT record's
	// detail is AttemptAlone).
	HopAlone bool
	// HopReleased: the delivery of hop Hop was handed back after attempt
	// HopAttempt started (a stop cut the call short, on purpose): the
	// process did not die in it.
	HopReleased bool
	// Copy is the latest copy written (nil: none).
	Copy *Copy
	// Settled: the delivery of hop Hop was acked.
	Settled bool
	// Position is the log position recorded when hop 0 was received.
	Position string
	// Last is the latest record.
	Last Record
}

// Copy is a retry or dead-letter copy as the journal recorded it.
type Copy struct {
	// At is when the copy was recorded, just before it was published.
	At        time.Time
	Hop       int
	Dest      string
	Attempt   int
	Trail     map[string]string
	Confirmed bool
}

// apply folds one record into s.
func (s *State) apply(r Record) {
	s.Found = true
	s.Last = r
	switch r.Kind {
	case Renewed:
		*s = State{Found: true, Last: r}
	case Received:
		if r.Hop > s.Hop {
			s.Hop, s.HopAttempt, s.HopOutcome, s.HopDetail, s.HopAlone, s.HopReleased, s.Settled = r.Hop, 0, 0, "", false, false, false
		}
		if r.Hop == 0 && r.Position != "" {
			s.Position = r.Position
		}
	case Attempt:
		s.Attempts = max(s.Attempts, r.Attempt)
		if r.Hop == s.Hop {
			s.HopAttempt, s.HopOutcome, s.HopDetail, s.HopAlone, s.HopReleased = r.Attempt, 0, "", r.Detail == AttemptAlone, false
		}
		if s.FirstAttemptAt.IsZero() {
			s.FirstAttemptAt = r.At
		}
	case Outcome:
		if r.Hop == s.Hop && r.Attempt == s.HopAttempt {
			s.HopOutcome, s.HopDetail = r.Outcome, r.Detail
		}
	case Transferring:
		s.Copy = &Copy{At: r.At, Hop: r.Hop, Dest: r.Dest, Attempt: r.Attempt, Trail: r.Trail}
	case Transferred:
		if s.Copy != nil && s.Copy.Hop == r.Hop {
			s.Copy.Confirmed = true
		}
	case Settled:
		if r.Hop == s.Hop {
			s.Settled = true
		}
	case Released:
		if r.Hop == s.Hop && s.HopAttempt > 0 {
			s.HopReleased = true
		}
	}
}

// State reads the state of hand-off k. An event the index does not know
// costs no read of the file: most deliveries are first deliveries.
func (j *Journal) State(k Key) (State, error) {
	var s State
	if !j.idx.knows(eventHash(k)) {
		return s, nil
	}
	err := j.db.View(func(tx *bolt.Tx) error {
		var buf [8]chainPart
		parts, err := j.history(tx, k, buf[:0], false)
		if err != nil {
			return err
		}
		var recs [8]Record
		for i := len(parts) - 1; i >= 0; i-- {
			rs, err := readRecords(parts[i].recs, parts[i].base, recs[:0])
			if err != nil {
				return err
			}
			for _, r := range rs {
				s.apply(r)
			}
		}
		return nil
	})
	return s, err
}
