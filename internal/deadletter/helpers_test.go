package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/testkit"
)

// memLog is a Log (and LedgerLog) in memory, with retention done by hand.
type memLog struct {
	name string
	mu   sync.Mutex
	// parts holds every message ever appended; first hides the removed.
	parts map[int32][]memEntry
	first map[int32]int64
	// beforeAppend, when set, runs before Append appends (a concurrent
	// writer slipping in).
	beforeAppend func()
	appends      int
	// failing, when set, is what First and Read return instead of
	// working (a broker down or refusing).
	failing error
	// readDelay is how long each Read takes to start (a busy broker).
	readDelay time.Duration
}

type memEntry struct {
	at  time.Time
	msg *broker.Message
}

func newMemLog(name string) *memLog {
	return &memLog{name: name, parts: map[int32][]memEntry{}, first: map[int32]int64{}}
}

func (l *memLog) Name() string { return l.name }

func (l *memLog) add(p int32, at time.Time, m *broker.Message) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.parts[p] = append(l.parts[p], memEntry{at: at, msg: m})
	return int64(len(l.parts[p]) - 1)
}

// truncate removes everything below first in partition p.
func (l *memLog) truncate(p int32, first int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.first[p] = first
}

func (l *memLog) First(context.Context) (map[int32]int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failing != nil {
		return nil, l.failing
	}
	out := map[int32]int64{}
	for p, es := range l.parts {
		if len(es) > 0 {
			out[p] = l.first[p]
		}
	}
	return out, nil
}

func (l *memLog) Read(ctx context.Context, from map[int32]int64, each ReadFunc) error {
	l.mu.Lock()
	if d := l.readDelay; d > 0 {
		l.mu.Unlock()
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
		l.mu.Lock()
	}
	if l.failing != nil {
		defer l.mu.Unlock()
		return l.failing
	}
	parts := map[int32][]memEntry{}
	for p, es := range l.parts {
		parts[p] = es[:len(es):len(es)]
	}
	first := maps.Clone(l.first)
	l.mu.Unlock()
	ps := make([]int32, 0, len(parts))
	for p := range parts {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	for _, p := range ps {
		start := max(from[p], first[p])
		for off := start; off < int64(len(parts[p])); off++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			e := parts[p][off]
			if err := each(p, off, e.at, e.msg); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *memLog) Append(_ context.Context, body []byte) error {
	if l.beforeAppend != nil {
		l.beforeAppend()
	}
	l.mu.Lock()
	l.appends++
	l.mu.Unlock()
	l.add(NoPartition, time.Now(), &broker.Message{Body: body})
	return nil
}

var _ LedgerLog = (*memLog)(nil)

// deadLetter is a DLQ copy as the sidecar writes it.
func deadLetter(event, reason string) *broker.Message {
	tr := broker.Trail{
		EventID: event, Attempt: 5, Hops: 5, ErrorClass: "permanent", Error: "amount invalid",
		Origin: "rabbitmq:orders", DeadReason: reason, FirstFailureAt: t0.Add(-time.Hour),
	}
	return &broker.Message{Body: []byte(`{"amount":"invalid"}`), ContentType: "application/json", Headers: tr.Headers()}
}

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// fixture is an index over one source's in-memory logs.
type fixture struct {
	x   *Index
	src Source
	dlq *memLog
	led *memLog
}

func newFixture(t *testing.T, partitions bool) *fixture {
	t.Helper()
	dlqName := "orders.dlq"
	if partitions {
		dlqName = "orders.billing.dlq"
	}
	f := &fixture{dlq: newMemLog(dlqName), led: newMemLog(dlqName + ".ledger")}
	f.src = Source{Name: "orders", DLQ: f.dlq, Ledger: f.led}
	f.x = openIndex(t, filepath.Join(t.TempDir(), "journal.db.deadletters"))
	return f
}

// openIndex opens an index at path, closed when the test ends and then
// checked: bbolt's own check, and the open and counts buckets agree with
// the letters.
func openIndex(t *testing.T, path string) *Index {
	t.Helper()
	x, err := Open(path, Options{Now: func() time.Time { return t0.Add(24 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = x.Close()
		checkIndex(t, path)
	})
	return x
}

func checkIndex(t *testing.T, path string) {
	t.Helper()
	testkit.BoltConsistent(t, path, func(tx *bolt.Tx) error {
		var errs []error
		counts := map[string]uint64{}
		open := map[string]bool{}
		err := tx.Bucket(bucketLetters).ForEach(func(k, v []byte) error {
			var l Letter
			if err := json.Unmarshal(v, &l); err != nil {
				return err
			}
			l.ID, _ = idFromKey(k)
			counts[string(countKey(l.Source, l.State))]++
			if l.Open() {
				open[string(openKey(&l))] = true
			}
			return nil
		})
		errs = append(errs, err)
		_ = tx.Bucket(bucketCounts).ForEach(func(k, v []byte) error {
			if n := bytesToU64(v); counts[string(k)] != n {
				errs = append(errs, errors.New("count of "+strconv.Quote(string(k))+" is "+strconv.FormatUint(n, 10)))
			}
			delete(counts, string(k))
			return nil
		})
		if len(counts) > 0 {
			errs = append(errs, errors.New("counts missing"))
		}
		_ = tx.Bucket(bucketOpen).ForEach(func(k, _ []byte) error {
			if !open[string(k)] {
				errs = append(errs, errors.New("stale open entry"))
			}
			delete(open, string(k))
			return nil
		})
		if len(open) > 0 {
			errs = append(errs, errors.New("open entries missing"))
		}
		return errors.Join(errs...)
	})
}

func bytesToU64(v []byte) uint64 {
	var n uint64
	for _, b := range v {
		n = n<<8 | uint64(b)
	}
	return n
}

// ledgerRecord appends a record as another replica would.
func (f *fixture) ledgerRecord(t *testing.T, r Record) {
	t.Helper()
	r.Version, r.Kind = RecordVersion, KindTransition
	if r.At.IsZero() {
		r.At = t0
	}
	if r.Who == "" {
		r.Who = "other-replica"
	}
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	f.led.add(NoPartition, t0, &broker.Message{Body: b})
}

func (f *fixture) catchUp(t *testing.T) Caught {
	t.Helper()
	c, err := f.x.CatchUp(context.Background(), f.src)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fixture) get(t *testing.T, id string) Letter {
	t.Helper()
	pid, err := ParseID(id)
	if err != nil {
		t.Fatal(err)
	}
	l, err := f.x.Get(pid)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
