package journal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// SyncMode is how hard the journal makes a record durable before Append
// returns.
type SyncMode uint8

const (
	// SyncBatch group-commits: one fsync for every record queued meanwhile.
	SyncBatch SyncMode = iota
	// SyncAlways commits (and fsyncs) each Append on its own.
	SyncAlways
	// SyncNone commits without fsync: a process crash loses nothing, a
	// machine crash may lose the last records.
	SyncNone
)

// ParseSyncMode reads "batch", "always" or "none".
func ParseSyncMode(s string) (SyncMode, bool) {
	switch s {
	case "batch", "":
		return SyncBatch, true
	case "always":
		return SyncAlways, true
	case "none":
		return SyncNone, true
	}
	return 0, false
}

func (m SyncMode) String() string {
	return [...]string{SyncBatch: "batch", SyncAlways: "always", SyncNone: "none"}[m]
}

// Options configures a Journal.
type Options struct {
	Sync SyncMode
	// MaxBatch bounds the records in one transaction; zero means 1024.
	MaxBatch int
	// Linger is how long the writer waits for more records before it
	// commits a batch that is not full. Zero commits at once: records that
	// arrive during a commit form the next batch anyway.
	Linger time.Duration
	// Retention is how long settled hand-offs are kept; zero means 24h.
	Retention time.Duration
	// CompactEvery is the compaction period; zero means a minute.
	CompactEvery time.Duration
	Logger       *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// ReadOnly opens an existing journal for queries only: no writer, no
	// compaction, and Append fails.
	ReadOnly bool
	// BeforeCommit, when set, runs inside each batch's transaction before it
	// commits; an error aborts the transaction. Tests use it to crash the
	// writer mid-batch.
	BeforeCommit func(records int) error
}

// Errors of the journal.
var (
	// ErrClosed is returned by Append after Close.
	ErrClosed = errors.New("journal: closed")
	// ErrLocked is returned by Open when another process holds the file.
	ErrLocked = errors.New("journal: file is locked by another process")
)

// CorruptError is returned by Open when the file cannot be read as a
// journal. The file is left as it is.
type CorruptError struct {
	Path string
	Err  error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("journal %s is unreadable: %v; keep what can be read with `sidecar journal repair --path %s`, or start empty with `sidecar journal reset --path %s` (the old file is kept aside; the broker still holds every unacked message)",
		e.Path, e.Err, e.Path, e.Path)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Bucket names.
var (
	bucketSteps   = []byte("steps")   // key ‖ seq → record
	bucketOpen    = []byte("open")    // key → opened-at: hand-offs not yet settled
	bucketSettled = []byte("settled") // settled-at ‖ key → nothing: the retention index
	bucketMeta    = []byte("meta")
	metaFormat    = []byte("format")
)

const formatVersion = 1

// Journal is an open journal file. Its methods are safe for concurrent use.
type Journal struct {
	path string
	db   *bolt.DB
	o    Options
	log  *slog.Logger
	now  func() time.Time

	mu     sync.RWMutex // guards closed against sends on reqs
	closed bool
	reqs   chan *request

	failMu sync.Mutex
	failed error // a failed commit: the journal accepts nothing more

	stop chan struct{}
	wg   sync.WaitGroup
}

type request struct {
	key  []byte
	recs []Record
	done chan error // nil: nobody waits
}

// Open opens (creating if needed) the journal at path, checks it, and reports
// the hand-offs a previous run left open.
func Open(path string, o Options) (*Journal, Recovery, error) {
	if o.MaxBatch <= 0 {
		o.MaxBatch = 1024
	}
	if o.Retention <= 0 {
		o.Retention = 24 * time.Hour
	}
	if o.CompactEvery <= 0 {
		o.CompactEvery = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ReadOnly {
		if _, err := os.Stat(path); err != nil {
			return nil, Recovery{}, fmt.Errorf("journal %s: %w", path, err)
		}
	}
	db, err := openDB(path, o.Sync == SyncNone, o.ReadOnly)
	if err != nil {
		return nil, Recovery{}, err
	}
	j := &Journal{
		path: path, db: db, o: o, log: o.Logger, now: o.Now,
		reqs: make(chan *request, 4*o.MaxBatch),
		stop: make(chan struct{}),
	}
	rec, err := j.safeVerify()
	if err != nil {
		_ = db.Close()
		return nil, Recovery{}, &CorruptError{Path: path, Err: err}
	}
	if o.ReadOnly {
		j.closed = true // nothing may be written
		close(j.reqs)
		close(j.stop)
		return j, rec, nil
	}
	j.wg.Add(2)
	go j.writer()
	go j.compactor()
	return j, rec, nil
}

func openDB(path string, noSync, readOnly bool) (db *bolt.DB, err error) {
	// bbolt panics on some forms of corruption; a journal that cannot be
	// read is a startup error, not a crash. The file is closed by hand then,
	// or its lock would outlive the failed open.
	var file *os.File
	defer func() {
		if r := recover(); r != nil {
			if file != nil {
				_ = file.Close()
			}
			db, err = nil, &CorruptError{Path: path, Err: fmt.Errorf("%v", r)}
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{
		Timeout: time.Second, NoSync: noSync, ReadOnly: readOnly,
		// NoFreelistSync would save a page write per commit, but rebuilding
		// the freelist on open walks the file in a goroutine of bbolt's own,
		// where a damaged page panics beyond recovery.
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: 64 << 20, // fewer remaps, which stall readers
		OpenFile: func(name string, flag int, mode os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, mode)
			file = f
			return f, err
		},
	})
	switch {
	case errors.Is(err, bolt.ErrTimeout):
		return nil, fmt.Errorf("%w: %s", ErrLocked, path)
	case err != nil && os.IsPermission(err):
		return nil, fmt.Errorf("open journal: %w", err)
	case err != nil:
		return nil, &CorruptError{Path: path, Err: err}
	}
	return db, nil
}

// Path is the journal file.
func (j *Journal) Path() string { return j.path }

// Append writes recs for k and returns once they are durable (as Sync
// defines it). The records of one call commit together or not at all.
func (j *Journal) Append(ctx context.Context, k Key, recs ...Record) error {
	req := &request{key: k.encode(nil), recs: recs, done: make(chan error, 1)}
	if err := j.enqueue(ctx, req); err != nil {
		return err
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// AppendAsync queues recs for k without waiting for them to be durable: for
// records whose loss in a crash costs nothing but a line of history.
func (j *Journal) AppendAsync(k Key, recs ...Record) {
	_ = j.enqueue(context.Background(), &request{key: k.encode(nil), recs: recs})
}

func (j *Journal) enqueue(ctx context.Context, req *request) error {
	if err := j.failure(); err != nil {
		return err
	}
	j.mu.RLock()
	defer j.mu.RUnlock()
	if j.closed {
		return ErrClosed
	}
	select {
	case j.reqs <- req:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (j *Journal) failure() error {
	j.failMu.Lock()
	defer j.failMu.Unlock()
	return j.failed
}

// writer is the one goroutine that writes: it gathers queued requests into a
// batch, commits it in one transaction, and answers every waiter.
func (j *Journal) writer() {
	defer j.wg.Done()
	batch := make([]*request, 0, 64)
	for {
		first, ok := <-j.reqs
		if !ok {
			return
		}
		batch = append(batch[:0], first)
		if j.o.Sync != SyncAlways {
			batch = j.gather(batch, len(first.recs))
		}
		err := j.commit(batch)
		if err != nil {
			j.failMu.Lock()
			if j.failed == nil {
				j.failed = fmt.Errorf("journal %s: commit failed: %w", j.path, err)
				j.log.Error("journal commit failed; the journal accepts no more records", "path", j.path, "err", err)
			}
			err = j.failed
			j.failMu.Unlock()
		}
		for _, r := range batch {
			if r.done != nil {
				r.done <- err
			}
		}
	}
}

// gather adds queued requests to batch until MaxBatch records, waiting up to
// Linger for more when the queue runs dry.
func (j *Journal) gather(batch []*request, n int) []*request {
	var linger <-chan time.Time
	for n < j.o.MaxBatch {
		select {
		case r, ok := <-j.reqs:
			if !ok {
				return batch
			}
			batch = append(batch, r)
			n += len(r.recs)
			continue
		default:
		}
		if j.o.Linger <= 0 {
			return batch
		}
		if linger == nil {
			linger = time.After(j.o.Linger)
		}
		select {
		case r, ok := <-j.reqs:
			if !ok {
				return batch
			}
			batch = append(batch, r)
			n += len(r.recs)
		case <-linger:
			return batch
		}
	}
	return batch
}

func (j *Journal) commit(batch []*request) error {
	return j.db.Update(func(tx *bolt.Tx) error {
		steps, open, settled := tx.Bucket(bucketSteps), tx.Bucket(bucketOpen), tx.Bucket(bucketSettled)
		n := 0
		for _, r := range batch {
			for i := range r.recs {
				rec := &r.recs[i]
				if rec.At.IsZero() {
					rec.At = j.now()
				}
				seq, err := steps.NextSequence()
				if err != nil {
					return err
				}
				if err := steps.Put(binary.BigEndian.AppendUint64(append([]byte(nil), r.key...), seq), rec.Encode(nil)); err != nil {
					return err
				}
				switch rec.Kind {
				case Received:
					if open.Get(r.key) == nil {
						if err := open.Put(r.key, timeBytes(rec.At)); err != nil {
							return err
						}
					}
				case Settled:
					if err := open.Delete(r.key); err != nil {
						return err
					}
					if err := settled.Put(append(timeBytes(rec.At), r.key...), nil); err != nil {
						return err
					}
				}
				n++
			}
		}
		if j.o.BeforeCommit != nil {
			return j.o.BeforeCommit(n)
		}
		return nil
	})
}

func timeBytes(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano()))
}

// Close stops accepting records, commits every queued one, stops compaction
// and closes the file. It is safe to call twice.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		if j.o.ReadOnly && j.db != nil {
			db := j.db
			j.db = nil
			return db.Close()
		}
		return nil
	}
	j.closed = true
	close(j.reqs)
	close(j.stop)
	j.mu.Unlock()
	j.wg.Wait()
	return j.db.Close()
}
