package journal

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// SyncMode is how hard the journal makes a record durable before Append
// returns.
type SyncMode uint8

const (
	// SyncBatch group-commits: one fsync for every record queued meanwhile.
	SyncBatch SyncMode = iota
	// SyncAlways commits (and fsyncs) each Append on its own; AppendAsync
	// records ride along with the next one.
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
	switch m {
	case SyncBatch:
		return "batch"
	case SyncAlways:
		return "always"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("sync(%d)", uint8(m))
}

// queuedBatches is how many batches of requests (MaxBatch each) may wait
// for the writer before a caller waits to queue one. A commit the disk holds
// up for a few hundred milliseconds, at ten thousand hand-offs a second,
// leaves a few thousand hand-offs queued, each with its attempt record and
// its outcome; a caller that found the queue full would wait out the stall,
// and an attempt record is queued before its call, so the app would wait
// too. Sixteen batches hold what a Kafka window and its answered records
// queue (see the kafka package's answeredFactor); the requests are pooled,
// made only as they queue, and the queue itself is 8 bytes a request.
const queuedBatches = 16

// Options configures a Journal.
type Options struct {
	Sync SyncMode
	// MaxBatch bounds the records in one transaction (a single larger Append
	// is a transaction of its own); zero means 1024.
	MaxBatch int
	// Linger is how long the writer waits for more records before it
	// commits a batch that is not full. Zero commits at once: records that
	// arrive during a commit form the next batch anyway.
	Linger time.Duration
	// Retention is how long settled hand-offs are kept; zero means 24h.
	Retention time.Duration
	// MaxSize bounds the journal's live data, in bytes: the file's pages
	// in use, its free pages not counted. Once it is reached, settled
	// hand-offs are dropped, the earliest settled first, until it is under
	// 90% of it; open ones never are. Zero means DefaultMaxSize; negative,
	// no bound but Retention.
	MaxSize int64
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
	// OnCommit, when set, is told each group commit's duration, after it
	// committed (metrics). It must be cheap.
	OnCommit func(took time.Duration)
	// AsyncDelay is how long records nobody waits for (AppendAsync) may
	// wait for a commit that somebody does, before they are committed on
	// their own: an fsync for records whose loss costs nothing but a line
	// of history is one saved. Zero means 5ms; negative, no wait.
	AsyncDelay time.Duration
	// OnEvict, when set, is told how many settled hand-offs were dropped
	// to keep within MaxSize, after each transaction that dropped some
	// (metrics). It must be cheap.
	OnEvict func(n int)
}

// Errors of the journal.
var (
	// ErrClosed is returned by Append after Close.
	ErrClosed = errors.New("journal: closed")
	// ErrLocked is returned by Open when another process holds the file.
	ErrLocked = errors.New("journal: file is locked by another process")
	// ErrNoRoom wraps a commit that failed because the file cannot grow or
	// be written: its disk is full, over a quota or a size limit, or
	// read-only. Unlike other failed commits it does not end the journal:
	// nothing of the failed batch landed, and later commits are tried.
	ErrNoRoom = errors.New("journal: no room to write")
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

// Bucket names. The records are an append-only log (part.go): one value
// per group commit under an increasing sequence number, so a commit writes
// at the end of one tree however random the event ids are, and the oldest
// history is dropped by sequence ranges. The index of events is in memory
// and in the index bucket's segments (index.go).
var (
	bucketLog  = []byte("log") // seq → value
	bucketMeta = []byte("meta")
	metaFormat = []byte("format")
	metaProbe  = []byte("probe") // the latest Probe's time
)

// formatVersion is the layout above. Format 1 keyed records by key ‖ seq,
// format 2 by hand-off id ‖ seq with an index by key; Open upgrades both.
const formatVersion = 3

// Journal is an open journal file. Its methods are safe for concurrent use.
type Journal struct {
	path string
	db   *bolt.DB
	o    Options
	log  *slog.Logger
	now  func() time.Time

	mu     sync.RWMutex // guards closed against sends on reqs
	closed bool
	reqs   chan *request // queuedBatches batches of requests
	// thens are the callbacks of committed AppendThen requests, for the
	// settler.
	thens *thens

	failMu sync.Mutex
	failed error // a failed commit: the journal accepts nothing more
	// full is the latest commit's failure for want of room, nil once a
	// commit succeeds again (see NoRoom).
	full error

	idx *index
	// nextSeq is the sequence number of the next log value; only the
	// writer moves it, after a commit.
	nextSeq uint64
	// slab holds the values and keys of the batch being written: bbolt
	// keeps them until the commit.
	slab []byte
	// staged is the index as the batch being written leaves it, applied
	// once the batch commits.
	staged staging
	// joins is the writer's: which requests of the batch being written
	// share a hand-off (see joins).
	joins joins

	instanceID string // see InstanceID

	commits commits // the latest group commits' durations, for Stats
	// lastBatch is how many requests the writer's latest commit held: it
	// lingers for more only after a busy one (see gather).
	lastBatch int

	pageSize int64     // bbolt's page size, for the live data's size
	trim     trimState // see TrimToSize
	// trimNow asks the compactor for a trim: the writer found the bound
	// reached after a commit. One request waits at most; more add nothing.
	trimNow chan struct{}

	stop chan struct{}
	wg   sync.WaitGroup
}

type request struct {
	key  Key
	recs []Record
	// wait is where the commit's error goes; nil: nobody waits.
	wait chan error
	// then, when set, is called with the commit's error (AppendThen).
	then Then
	// done is wait's channel, kept with a pooled request while it is not
	// waited on.
	done chan error
	// pooled requests (Append, AppendAsync) go back to the pool: an
	// AppendAsync's once the writer is done with it.
	pooled bool
	inline [4]Record
	// probe is a request that writes no records: its commit only says
	// whether the journal can be written (Probe).
	probe bool
	// marks is a request that writes high-water marks, no records.
	marks map[string]int64
	// drop is a request that drops the oldest history (retention.go).
	drop *dropRequest
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
	if o.MaxSize == 0 {
		o.MaxSize = DefaultMaxSize
	}
	if o.AsyncDelay == 0 {
		o.AsyncDelay = defaultAsyncDelay
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
	if format := safeFormat(db); !o.ReadOnly && format != 0 && format < formatVersion {
		_ = db.Close()
		if err := upgradeFile(path, format, o); err != nil {
			return nil, Recovery{}, fmt.Errorf("journal %s: %w", path, err)
		}
		if db, err = openDB(path, o.Sync == SyncNone, o.ReadOnly); err != nil {
			return nil, Recovery{}, err
		}
	}
	j := &Journal{
		path: path, db: db, o: o, log: o.Logger, now: o.Now,
		reqs:     make(chan *request, queuedBatches*o.MaxBatch),
		thens:    newThens(),
		stop:     make(chan struct{}),
		idx:      newIndex(),
		pageSize: int64(db.Info().PageSize),
		trimNow:  make(chan struct{}, 1),
	}
	rec, err := j.safeVerify()
	if err != nil {
		_ = db.Close()
		var up *upgradeError
		if errors.As(err, &up) {
			return nil, Recovery{}, fmt.Errorf("journal %s: %w", path, err)
		}
		return nil, Recovery{}, &CorruptError{Path: path, Err: err}
	}
	if err := j.loadInstanceID(); err != nil {
		_ = db.Close()
		return nil, Recovery{}, fmt.Errorf("journal %s: %w", path, err)
	}
	if o.ReadOnly {
		j.closed = true // nothing may be written
		close(j.reqs)
		close(j.stop)
		return j, rec, nil
	}
	j.wg.Add(3)
	go j.writer()
	go j.settler()
	go j.compactor()
	return j, rec, nil
}

// safeFormat is the journal's format, 0 when the file is new or cannot be
// read (verify tells why).
func safeFormat(db *bolt.DB) (format uint32) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			format = 0
		}
	}()
	format, _ = readFormat(db)
	return format
}

func openDB(path string, noSync, readOnly bool) (db *bolt.DB, err error) {
	// bbolt panics on some forms of corruption; a journal that cannot be
	// read is a startup error, not a crash. The file is closed by hand then,
	// or its lock would outlive the failed open.
	var file *os.File
	// A truncated file faults (SIGBUS) when bbolt reads past its end through
	// the mapping; as a panic it can be recovered and reported.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if file != nil {
				_ = file.Close()
			}
			// A mapping of the file holds its open file description, and
			// with it the lock: bbolt may have mapped it before it panicked.
			unmapFile(path)
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
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("%w: %s", ErrLocked, path)
	case err != nil && (os.IsPermission(err) || errors.Is(err, fs.ErrNotExist)):
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
	req := newRecords(k, recs, true)
	err := j.enqueue(ctx, req)
	if err != nil {
		req.free()
		return err
	}
	select {
	case err = <-req.done:
		req.free()
		return err
	case <-ctx.Done():
		// The writer still holds it, and will answer it: it is not reused.
		return ctx.Err()
	}
}

// await queues req and waits for its commit.
func (j *Journal) await(ctx context.Context, req *request) error {
	req.wait = req.done
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
	req := newRecords(k, recs, false)
	if err := j.enqueue(context.Background(), req); err != nil {
		req.free()
	}
}

// requests are reused: a hand-off makes one or more, and the records they carry
// are copied into them, so that neither the requests nor the callers'
// records are allocated per call.
var requests = sync.Pool{New: func() any { return &request{done: make(chan error, 1)} }}

// newRecords is a request for recs of k, from the pool. A waited one keeps
// its done channel; one nobody waits for is freed by the writer.
func newRecords(k Key, recs []Record, waited bool) *request {
	req := requests.Get().(*request)
	req.key, req.pooled = k, true
	req.recs = append(req.inline[:0], recs...)
	if waited {
		req.wait = req.done
	}
	return req
}

// free returns req to the pool, its records dropped.
func (r *request) free() {
	if !r.pooled {
		return
	}
	clear(r.inline[:])
	if cap(r.recs) > len(r.inline) {
		r.recs = nil // a large one's own array goes with it
	}
	r.recs, r.wait, r.then, r.key = nil, nil, nil, Key{}
	requests.Put(r)
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
	if ctx.Done() == nil {
		// Nothing to wait for but the queue (AppendAsync, AppendThen): a
		// plain send costs less than a select.
		j.reqs <- req
		return nil
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
