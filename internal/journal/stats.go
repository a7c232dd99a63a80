package journal

import (
	"errors"

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
// latency. It counts the open hand-offs one by one: it is for operators,
// not the hot path.
func (j *Journal) Stats() (Stats, error) {
	st := Stats{Path: j.path, Commits: j.commits.latency()}
	err := j.db.View(func(tx *bolt.Tx) error {
		st.Size = tx.Size()
		st.InUse = st.Size - j.freeBytes()
		b := tx.Bucket(bucketPending)
		if b == nil {
			return errors.New("journal: no pending index")
		}
		st.Open = int64(b.Stats().KeyN)
		return nil
	})
	return st, err
}
