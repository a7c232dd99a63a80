package journal

import (
	"bytes"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// idCache holds the ids of recently written hand-offs by encoded key: a
// hand-off's records come in a few requests, and all but the first skip the
// index lookup, a random page.
//
// An id enters the cache only once the transaction that wrote or read it has
// committed, so a failed transaction leaves nothing behind. Compaction
// removes an id inside its transaction and bumps the generation, and ids
// gathered by a transaction that began before that are not added: an id the
// journal no longer has is never handed out.
type idCache struct {
	mu  sync.Mutex
	gen uint64
	m   map[string][]byte
}

// idCacheSize bounds the cache; it is emptied when full.
const idCacheSize = 4096

func newIDCache() *idCache { return &idCache{m: map[string][]byte{}} }

func (c *idCache) get(k []byte) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[string(k)]
}

func (c *idCache) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// add caches ids gathered by a transaction that began at generation gen.
func (c *idCache) add(gen uint64, ids map[string][]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if len(c.m)+len(ids) > idCacheSize {
		clear(c.m)
	}
	for k, id := range ids {
		c.m[k] = id
	}
}

func (c *idCache) remove(k []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.m, string(k))
}

// ids resolves hand-off ids within one write transaction, through the cache,
// and adds what it resolved to the cache when the transaction commits, and
// the keys it gave ids to the recent index (unless index: then their
// entries are written at once).
type ids struct {
	c     *idCache
	b     *tree // the transaction's, shared with its writer
	found map[string][]byte
	fresh map[string][]byte
	index bool
}

func (j *Journal) resolver(tx *bolt.Tx, b *tree) *ids {
	r := &ids{c: j.ids, b: b, found: map[string][]byte{}, fresh: map[string][]byte{}}
	gen := j.ids.generation()
	tx.OnCommit(func() {
		j.ids.add(gen, r.found)
		j.recent.add(r.fresh)
	})
	return r
}

// id returns the id of the hand-off with encoded key k, giving it one when
// it has none.
func (r *ids) id(k []byte) ([]byte, error) {
	if id := r.found[string(k)]; id != nil {
		return id, nil
	}
	if id := r.c.get(k); id != nil {
		return id, nil
	}
	id, fresh, err := r.b.id(k, r.index)
	if err != nil {
		return nil, err
	}
	id = bytes.Clone(id) // the index's copy lives in the file's mapping
	r.found[string(k)] = id
	if fresh && !r.index {
		r.fresh[string(k)] = id
	}
	return id, nil
}
