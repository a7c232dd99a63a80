package deadletter

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The index's buckets.
var (
	// letters: ID.key → Letter as JSON.
	bucketLetters = []byte("letters")
	// open: source, 0, dead-lettered-at (Unix ns, big-endian), ID.key → nothing.
	// The first key of a source is its oldest open dead letter.
	bucketOpen = []byte("open")
	// counts: source, 0, state → count (uint64 big-endian).
	bucketCounts = []byte("counts")
	// offsets: log, 0, partition+1 (uint32 big-endian) → next offset to read.
	bucketOffsets = []byte("offsets")
	// meta: "version" → indexVersion.
	bucketMeta = []byte("meta")
)

// indexVersion is the index's schema. An index of another version is
// rebuilt from the logs: it holds nothing the logs do not.
const indexVersion = 2

// Options configures an Index.
type Options struct {
	Logger *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Index is a replica's local view of the dead letters, built from the logs
// alone so that it can be deleted and rebuilt at any time. It is safe for
// concurrent use.
type Index struct {
	db  *bolt.DB
	log *slog.Logger
	now func() time.Time
	// catchUp serialises CatchUps: two at once would read the same logs
	// for nothing. (What is applied is safe either way: each batch applies
	// only entries past the offsets it finds stored.)
	// It is a semaphore, not a mutex, so that a caller waiting for it can
	// give up with its context.
	catchUp chan struct{}
}

// Open opens or creates the index file at path (by convention the journal's
// path with ".deadletters" added: a file of its own, so that rebuilding it
// never touches the journal, and its writes never wait for the journal's).
func Open(path string, o Options) (*Index, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open dead-letter index %s: %w", path, err)
	}
	x := &Index{db: db, log: o.Logger, now: o.Now, catchUp: make(chan struct{}, 1)}
	if err := db.Update(x.prepare); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open dead-letter index %s: %w", path, err)
	}
	return x, nil
}

// prepare creates the buckets, and empties an index of another version.
func (x *Index) prepare(tx *bolt.Tx) error {
	if m := tx.Bucket(bucketMeta); m != nil {
		if v := m.Get([]byte("version")); len(v) == 8 && binary.BigEndian.Uint64(v) != indexVersion {
			x.log.Warn("dead-letter index of another version: rebuilding it from the logs", "version", binary.BigEndian.Uint64(v))
			for _, b := range [][]byte{bucketLetters, bucketOpen, bucketCounts, bucketOffsets, bucketMeta, bucketRuns} {
				if err := tx.DeleteBucket(b); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
					return err
				}
			}
		}
	}
	for _, b := range [][]byte{bucketLetters, bucketOpen, bucketCounts, bucketOffsets, bucketMeta, bucketRuns} {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return err
		}
	}
	return tx.Bucket(bucketMeta).Put([]byte("version"), binary.BigEndian.AppendUint64(nil, indexVersion))
}

// Close closes the file. It is safe to call twice.
func (x *Index) Close() error {
	return x.db.Close()
}

// Get returns the dead letter id, or ErrNotFound.
func (x *Index) Get(id ID) (Letter, error) {
	var l Letter
	err := x.db.View(func(tx *bolt.Tx) error {
		got, ok, err := getLetter(tx, id)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		l = got
		return nil
	})
	return l, err
}

func getLetter(tx *bolt.Tx, id ID) (Letter, bool, error) {
	v := tx.Bucket(bucketLetters).Get(id.key())
	if v == nil {
		return Letter{}, false, nil
	}
	var l Letter
	if err := json.Unmarshal(v, &l); err != nil {
		return Letter{}, false, fmt.Errorf("dead-letter index entry %s: %w", id, err)
	}
	l.ID = id
	return l, true, nil
}

// putLetter stores l, keeping the open and counts buckets in step with it;
// old is what was stored before (nil for a new letter).
func putLetter(tx *bolt.Tx, old *Letter, l *Letter) error {
	v, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if err := tx.Bucket(bucketLetters).Put(l.ID.key(), v); err != nil {
		return err
	}
	if old != nil {
		if err := addCount(tx, old.Source, old.State, -1); err != nil {
			return err
		}
		if old.Open() {
			if err := tx.Bucket(bucketOpen).Delete(openKey(old)); err != nil {
				return err
			}
		}
	}
	if err := addCount(tx, l.Source, l.State, 1); err != nil {
		return err
	}
	if l.Open() {
		return tx.Bucket(bucketOpen).Put(openKey(l), nil)
	}
	return nil
}

func openKey(l *Letter) []byte {
	k := append([]byte(l.Source), 0)
	k = binary.BigEndian.AppendUint64(k, uint64(l.DeadLetteredAt.UnixNano()))
	return append(k, l.ID.key()...)
}

func countKey(source string, s State) []byte {
	return append(append([]byte(source), 0), s...)
}

func addCount(tx *bolt.Tx, source string, s State, d int64) error {
	b := tx.Bucket(bucketCounts)
	k := countKey(source, s)
	var n uint64
	if v := b.Get(k); len(v) == 8 {
		n = binary.BigEndian.Uint64(v)
	}
	n = uint64(int64(n) + d)
	if n == 0 {
		return b.Delete(k)
	}
	return b.Put(k, binary.BigEndian.AppendUint64(nil, n))
}

// Counts is what an operator watches for one source.
type Counts struct {
	// ByState counts the dead letters in each state; a state with none is
	// left out.
	ByState map[State]int
	// Open counts those not closed.
	Open int
	// OldestOpen is when the oldest open dead letter was dead-lettered,
	// zero when none is open.
	OldestOpen time.Time
}

// Counts returns source's counts, read from the index alone.
func (x *Index) Counts(source string) (Counts, error) {
	c := Counts{ByState: map[State]int{}}
	err := x.db.View(func(tx *bolt.Tx) error {
		prefix := append([]byte(source), 0)
		cur := tx.Bucket(bucketCounts).Cursor()
		for k, v := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = cur.Next() {
			s := State(k[len(prefix):])
			n := int(binary.BigEndian.Uint64(v))
			c.ByState[s] = n
			if !s.Closed() {
				c.Open += n
			}
		}
		if k, _ := tx.Bucket(bucketOpen).Cursor().Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && len(k) >= len(prefix)+8 {
			c.OldestOpen = time.Unix(0, int64(binary.BigEndian.Uint64(k[len(prefix):]))).UTC()
		}
		return nil
	})
	return c, err
}

// Offsets returns the next offset the index reads of log, per partition.
func (x *Index) Offsets(log string) (map[int32]int64, error) {
	out := map[int32]int64{}
	err := x.db.View(func(tx *bolt.Tx) error {
		prefix := append([]byte(log), 0)
		cur := tx.Bucket(bucketOffsets).Cursor()
		for k, v := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = cur.Next() {
			if len(k) == len(prefix)+4 && len(v) == 8 {
				out[int32(binary.BigEndian.Uint32(k[len(prefix):]))-1] = int64(binary.BigEndian.Uint64(v))
			}
		}
		return nil
	})
	return out, err
}

func nextOffset(tx *bolt.Tx, log string, p int32) (int64, bool) {
	v := tx.Bucket(bucketOffsets).Get(partitionPrefix(log, p))
	if len(v) != 8 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(v)), true
}

func setNextOffset(tx *bolt.Tx, log string, p int32, next int64) error {
	return tx.Bucket(bucketOffsets).Put(partitionPrefix(log, p), binary.BigEndian.AppendUint64(nil, uint64(next)))
}
