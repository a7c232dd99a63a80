package journal

import (
	bolt "go.etcd.io/bbolt"
)

// Stats is a reading of an open journal for operators.
type Stats struct {
	Path string
	// Size is the file's size in bytes.
	Size int64
	// InUse is the live data, in bytes: Size less the free pages bbolt
	// reuses before it grows the file. MaxSize bounds it.
	InUse int64
	// Open is the hand-offs not yet settled.
	Open int64
	// Commits is the latency of the latest group commits.
	Commits CommitLatency
}

// Stats reads the journal's size, its open hand-offs and its commit
// latency. It reads the open hand-offs one by one: it is for operators,
// not the hot path.
func (j *Journal) Stats() (Stats, error) {
	st := Stats{Path: j.path, Commits: j.commits.latency()}
	err := j.db.View(func(tx *bolt.Tx) error {
		st.Size = tx.Size()
		st.InUse = st.Size - j.freeBytes()
		return nil
	})
	if err != nil {
		return st, err
	}
	st.Open, err = j.countOpenHandoffs()
	return st, err
}

// countOpenHandoffs counts the hand-offs of the open set's events that are
// open.
func (j *Journal) countOpenHandoffs() (int64, error) {
	j.idx.mu.RLock()
	hashes := make([]uint64, 0, len(j.idx.open))
	for h := range j.idx.open {
		hashes = append(hashes, h)
	}
	j.idx.mu.RUnlock()
	var n int64
	err := j.db.View(func(tx *bolt.Tx) error {
		for _, h := range hashes {
			r, err := j.idx.resolve(tx, h)
			if err != nil {
				return err
			}
			err = j.eachHandoffFrom(tx, r, func(_ Key, recs []Record, _ ref) {
				var t openTrack
				for i := range recs {
					t.apply(&recs[i])
				}
				if t.open {
					n++
				}
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}
