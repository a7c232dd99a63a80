package journal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The key index (the ids bucket, key → id) is the journal's only write to a
// random place: event ids are UUIDs, so each new hand-off's entry lands on
// its own page, and a group commit of a hundred hand-offs rewrote about a
// hundred index pages. So a new hand-off's entry is not written there at
// once. It is kept in memory (recentIndex) and merged into the bucket later,
// many at a time in key order, a chunk riding on each group commit: a page
// is rewritten once for all the keys that land on it, not once for each.
//
// Nothing is lost with the memory: a hand-off's key is also its first record
// (id ‖ 0), written in the transaction that gives it its id, and ids are
// given in order. The meta bucket says up to which id every key is in the
// bucket (metaMerged); at open the keys of the later ids are read back from
// their first records, a few thousand at most.

// metaMerged holds the id up to which every hand-off's key is in the ids
// bucket.
var metaMerged = []byte("index-merged")

const (
	// defaultMergeAt is how many keys wait in memory before a merge starts.
	defaultMergeAt = 8192
	// defaultMergeEvery starts a merge of fewer keys after this long.
	defaultMergeEvery = 10 * time.Second
	// mergeChunk bounds the keys merged in one group commit, so that a
	// merge never makes one commit long. A commit of MaxBatch (1024)
	// records brings at most 512 new keys (two records each at least): the
	// merge keeps ahead of them.
	mergeChunk = 1024
)

// recentIndex holds the keys given an id and not yet merged into the ids
// bucket, and the merge in progress. Lookups may come from any goroutine;
// the merge is the writer's alone.
type recentIndex struct {
	mu sync.RWMutex
	m  map[string][]byte // encoded key → id

	// The merge in progress, the writer's: the keys it merges, in key
	// order, how many are merged, and the highest id among them.
	round     []recentEntry
	next      int
	upTo      uint64
	lastRound time.Time
}

type recentEntry struct {
	key string
	id  []byte
}

func newRecentIndex() *recentIndex { return &recentIndex{m: map[string][]byte{}} }

func (r *recentIndex) get(k []byte) []byte {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.m[string(k)]
}

func (r *recentIndex) size() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.m)
}

// add keeps new keys, once the transaction that gave them ids committed.
func (r *recentIndex) add(ids map[string][]byte) {
	if r == nil || len(ids) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, id := range ids {
		r.m[k] = id
	}
}

// remove forgets key k if it still names id: its hand-off was removed, or
// its entry is in the bucket now.
func (r *recentIndex) remove(k, id []byte) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, ok := r.m[string(k)]; ok && bytes.Equal(v, id) {
		delete(r.m, string(k))
	}
}

// withPrefix returns the entries whose key starts with p, in key order.
func (r *recentIndex) withPrefix(p []byte) []recentEntry {
	r.mu.RLock()
	var out []recentEntry
	for k, id := range r.m {
		if strings.HasPrefix(k, string(p)) {
			out = append(out, recentEntry{k, id})
		}
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b recentEntry) int { return strings.Compare(a.key, b.key) })
	return out
}

// mergeSome merges the next chunk of waiting keys into the ids bucket, in
// tx (a group commit), starting a merge when enough keys wait or they have
// waited long enough. When the merge's last chunk commits, metaMerged moves
// to its highest id. Only the writer calls it.
func (j *Journal) mergeSome(tx *bolt.Tx, b *tree) error {
	r := j.recent
	if r.round == nil {
		n := r.size()
		if n == 0 || n < j.o.mergeAt && j.now().Sub(r.lastRound) < j.o.mergeEvery {
			return nil
		}
		r.mu.RLock()
		round := make([]recentEntry, 0, len(r.m))
		for k, id := range r.m {
			round = append(round, recentEntry{k, id})
			r.upTo = max(r.upTo, binary.BigEndian.Uint64(id))
		}
		r.mu.RUnlock()
		slices.SortFunc(round, func(a, b recentEntry) int { return strings.Compare(a.key, b.key) })
		r.round, r.next = round, 0
	}
	chunk := r.round[r.next:min(r.next+mergeChunk, len(r.round))]
	for _, e := range chunk {
		// A hand-off removed meanwhile (retention, max_size) has lost its
		// first record: its key must not come back.
		if b.records.Get(binary.BigEndian.AppendUint64(e.id[:idLen:idLen], 0)) == nil {
			continue
		}
		if err := b.ids.Put([]byte(e.key), e.id); err != nil {
			return err
		}
	}
	end := r.next + len(chunk)
	last := end == len(r.round)
	if last {
		if err := tx.Bucket(bucketMeta).Put(metaMerged, binary.BigEndian.AppendUint64(nil, r.upTo)); err != nil {
			return err
		}
	}
	tx.OnCommit(func() {
		for _, e := range chunk {
			r.remove([]byte(e.key), e.id)
		}
		r.next = end
		if last {
			r.round, r.lastRound = nil, j.now()
		}
	})
	return nil
}

// loadRecent reads back the keys not yet merged into the ids bucket: those
// of the ids after metaMerged. A journal without metaMerged was written by
// a version that put every key in the bucket at once; it gets one here.
func (j *Journal) loadRecent() error {
	j.recent = newRecentIndex()
	j.recent.lastRound = j.now()
	var merged uint64
	missing := false
	err := j.db.View(func(tx *bolt.Tx) error {
		b := j.buckets(tx)
		v := tx.Bucket(bucketMeta).Get(metaMerged)
		switch {
		case v == nil:
			missing, merged = true, b.ids.Sequence()
		case len(v) == 8:
			merged = binary.BigEndian.Uint64(v)
		default:
			return fmt.Errorf("%w: %s of %d bytes", ErrCorrupt, metaMerged, len(v))
		}
		c := b.records.Cursor()
		for k, v := c.Seek(binary.BigEndian.AppendUint64(nil, merged+1)); k != nil; k, v = c.Next() {
			if len(k) != 2*idLen {
				return fmt.Errorf("%w: record key of %d bytes", ErrCorrupt, len(k))
			}
			if binary.BigEndian.Uint64(k[idLen:]) == 0 {
				j.recent.m[string(v)] = bytes.Clone(k[:idLen])
			}
		}
		return nil
	})
	if err != nil || !missing || j.o.ReadOnly {
		return err
	}
	return j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(metaMerged, binary.BigEndian.AppendUint64(nil, merged))
	})
}
