package deadletter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Filter selects dead letters. Zero fields select everything.
type Filter struct {
	Source string
	// States selects any of these states.
	States []State
	Reason string
	// EventID selects one event's dead letters.
	EventID string
	// Since and Until bound the dead-lettered-at time: Since ≤ t < Until.
	Since, Until time.Time
	// After is the last id of the page before: the list goes on after it.
	After string
	// Limit caps the page; DefaultLimit when 0, MaxLimit at most.
	Limit int
}

// Paging bounds.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Page is one page of a list.
type Page struct {
	Letters []Letter
	// Next is the After of the next page, empty on the last.
	Next string
}

// List returns the dead letters f selects, in DLQ position order (by log,
// partition, offset), from the index alone. Only letters whose DLQ entry
// was read are listed.
func (x *Index) List(f Filter) (Page, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	var start []byte
	if f.After != "" {
		id, err := ParseID(f.After)
		if err != nil {
			return Page{}, fmt.Errorf("page token: %w", err)
		}
		start = id.key()
	}
	var p Page
	err := x.db.View(func(tx *bolt.Tx) error {
		cur := tx.Bucket(bucketLetters).Cursor()
		k, v := cur.First()
		if start != nil {
			k, v = cur.Seek(start)
			if bytes.Equal(k, start) {
				k, v = cur.Next()
			}
		}
		for ; k != nil; k, v = cur.Next() {
			id, ok := idFromKey(k)
			if !ok {
				continue
			}
			var l Letter
			if err := json.Unmarshal(v, &l); err != nil {
				return fmt.Errorf("dead-letter index entry %s: %w", id, err)
			}
			l.ID = id
			if !f.match(&l) {
				continue
			}
			if len(p.Letters) == limit {
				p.Next = p.Letters[len(p.Letters)-1].ID.String()
				return nil
			}
			p.Letters = append(p.Letters, l)
		}
		return nil
	})
	return p, err
}

func (f *Filter) match(l *Letter) bool {
	if !l.Seen || (f.Source != "" && l.Source != f.Source) || (f.Reason != "" && l.Reason != f.Reason) ||
		(f.EventID != "" && l.EventID != f.EventID) {
		return false
	}
	if (!f.Since.IsZero() && l.DeadLetteredAt.Before(f.Since)) || (!f.Until.IsZero() && !l.DeadLetteredAt.Before(f.Until)) {
		return false
	}
	if len(f.States) == 0 {
		return true
	}
	for _, s := range f.States {
		if l.State == s {
			return true
		}
	}
	return false
}
