package journal

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// logRecorder is a slog handler that keeps what is logged, for tests that
// check a line was (or was not) written.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// at returns the records logged at level, each as its attributes by key.
func (l *logRecorder) at(level slog.Level) []map[string]slog.Value {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]slog.Value
	for _, r := range l.recs {
		if r.Level != level {
			continue
		}
		attrs := map[string]slog.Value{"msg": slog.StringValue(r.Message)}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.Resolve()
			return true
		})
		out = append(out, attrs)
	}
	return out
}

// liveSize is the live data of the closed journal file at path, read the
// way bbolt sees it: the pages up to the high water mark less the free ones.
func liveSize(t testing.TB, path string) (live, file int64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(tx *bolt.Tx) error {
		live = tx.Size() - int64(db.Stats().FreePageN*db.Info().PageSize)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return live, fi.Size()
}

// writeSettled writes n hand-offs of source src, each handled on its first
// attempt and settled at base plus its index in milliseconds, and returns
// once they are durable.
func writeSettled(t testing.TB, j *Journal, src string, from, n int, base time.Time) {
	t.Helper()
	for i := from; i < from+n; i++ {
		k := Key{Source: src, EventID: fmt.Sprintf("order-%06d", i)}
		recs := storySettledSuccess(base.Add(time.Duration(i) * time.Millisecond))
		if i == from+n-1 {
			appendOK(t, j, k, recs...) // waits for the queue ahead of it too
		} else {
			j.AppendAsync(k, recs...)
		}
	}
}

// kept is the indexes of the hand-offs of source src the journal still holds.
func kept(t testing.TB, j *Journal, src string) []int {
	t.Helper()
	var out []int
	if err := j.Scan(Filter{}, func(k Key, _ []Step) error {
		if k.Source == src {
			var i int
			if _, err := fmt.Sscanf(k.EventID, "order-%d", &i); err != nil {
				return err
			}
			out = append(out, i)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// Written far past MaxSize, the journal keeps its live data under it by
// dropping the earliest settled hand-offs: what is left is the latest ones,
// without a gap, and OnEvict was told of every one dropped.
func TestMaxSizeDropsTheEarliestSettled(t *testing.T) {
	const (
		maxSize = 1 << 20
		rounds  = 80
		round   = 250
	)
	var evicted atomic.Int64
	path := newPath(t)
	clock := newFakeClock()
	j, _ := openJournal(t, path, Options{Now: clock.Now, Sync: SyncNone, MaxSize: maxSize,
		OnEvict: func(n int) { evicted.Add(int64(n)) }})
	var peak int64
	for r := range rounds {
		writeSettled(t, j, "s", r*round, round, at(0))
		// The writer asks for a trim once the bound is reached; the
		// compactor may not have run yet. A trim of its own makes each
		// round's reading the same on any machine.
		peak = max(peak, j.inUse())
		if _, err := j.TrimToSize(); err != nil {
			t.Fatalf("round %d: TrimToSize: %v", r, err)
		}
		if used := j.inUse(); used >= maxSize {
			t.Fatalf("round %d: %d bytes in use after a trim, want under %d", r, used, maxSize)
		}
	}
	left := kept(t, j, "s")
	const written = rounds * round
	if len(left) == 0 || len(left) == written {
		t.Fatalf("%d of %d hand-offs kept: want the earliest dropped and the latest kept", len(left), written)
	}
	if first, last := left[0], left[len(left)-1]; last != written-1 || last-first+1 != len(left) {
		t.Errorf("kept hand-offs %d..%d (%d of them): want the latest ones, without a gap, up to %d", first, last, len(left), written-1)
	}
	if n := evicted.Load(); n != int64(written-len(left)) {
		t.Errorf("OnEvict told of %d hand-offs dropped, want %d (%d written, %d kept)", n, written-len(left), written, len(left))
	}
	st, err := j.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	live, file := liveSize(t, path)
	if live >= maxSize {
		t.Errorf("the closed file holds %d bytes of live data, want under %d", live, maxSize)
	}
	t.Logf("%d hand-offs written, %d kept (%d bytes each in use); live data %d bytes (%.0f%% of the bound), peak before a trim %d (%.0f%%), file %d bytes; Stats.InUse %d",
		written, len(left), live/int64(len(left)), live, 100*float64(live)/maxSize, peak, 100*float64(peak)/maxSize, file, st.InUse)
}

// Open hand-offs are never dropped, even when they alone fill MaxSize: the
// settled ones go, the open ones stay, the journal goes on taking records,
// and an Error says so at most once a minute.
func TestMaxSizeNeverDropsOpen(t *testing.T) {
	const maxSize = 1 << 20
	logs := &logRecorder{}
	var evicted atomic.Int64
	path := newPath(t)
	clock := newFakeClock()
	j, _ := openJournal(t, path, Options{Now: clock.Now, Sync: SyncNone, MaxSize: maxSize, Logger: slog.New(logs),
		OnEvict: func(n int) { evicted.Add(int64(n)) }})
	const settled = 500
	writeSettled(t, j, "settled", 0, settled, at(0))
	// A hand-off settled at hop 0 and received again at hop 1 is open
	// too, though the expiry index holds it.
	reopened := Key{Source: "reopened", EventID: "e"}
	appendOK(t, j, reopened, storySettledCopy(at(0))...)
	appendOK(t, j, reopened, Record{Kind: Received, At: at(time.Second), Hop: 1})
	open := 0
	for ; j.inUse() < 2*maxSize; open++ {
		k := Key{Source: "open", EventID: fmt.Sprintf("order-%06d", open)}
		j.AppendAsync(k, storyInCall(at(time.Minute))...)
		if open%500 == 499 {
			appendOK(t, j, k, Record{Kind: Outcome, At: at(time.Minute), Attempt: 1, Outcome: outRetry, Status: 503})
		}
	}
	appendOK(t, j, Key{Source: "open", EventID: "last"}, storyReceived(at(time.Minute))...)
	open++

	for i := range 2 {
		if _, err := j.TrimToSize(); err != nil {
			t.Fatalf("TrimToSize %d: %v", i+1, err)
		}
	}
	if n := len(kept(t, j, "settled")); n != 0 {
		t.Errorf("%d settled hand-offs kept over the bound, want every one dropped", n)
	}
	if n := evicted.Load(); n != settled {
		t.Errorf("OnEvict told of %d dropped, want %d", n, settled)
	}
	if errs := logs.at(slog.LevelError); len(errs) != 1 {
		t.Fatalf("%d Error lines after trims within a minute, want 1: %v", len(errs), errs)
	}
	clock.Advance(time.Minute)
	if _, err := j.TrimToSize(); err != nil {
		t.Fatal(err)
	}
	errs := logs.at(slog.LevelError)
	if len(errs) != 2 {
		t.Fatalf("%d Error lines a minute later, want 2", len(errs))
	}
	if got := errs[1]["open"].Int64(); got != int64(open)+1 {
		t.Errorf("the Error line says %d open, want %d", got, open+1)
	}
	// The journal still writes, and a restart finds every open hand-off.
	appendOK(t, j, Key{Source: "open", EventID: "after"}, storyReceived(at(2*time.Minute))...)
	_, rec := reopen(t, j, Options{Now: clock.Now, Sync: SyncNone, MaxSize: maxSize, Logger: slog.New(logs)})
	if rec.Open != open+2 {
		t.Errorf("after a restart %d hand-offs are open, want %d (none dropped)", rec.Open, open+2)
	}
}

// The Warn line is written at most once a minute, and the compactor's tick
// tells what a trim within the minute held back: the lines add up to what
// OnEvict was told.
func TestMaxSizeWarnsOnceAMinute(t *testing.T) {
	const maxSize = 1 << 20
	logs := &logRecorder{}
	var evicted atomic.Int64
	clock := newFakeClock()
	j, _ := openJournal(t, newPath(t), Options{Now: clock.Now, Sync: SyncNone, MaxSize: maxSize, Logger: slog.New(logs),
		OnEvict: func(n int) { evicted.Add(int64(n)) }})
	next := 0
	// fill writes until hand-offs are dropped (the writer asks for a trim
	// as the bound is reached), then trims: the live data is under the
	// bound after it, so that no trim asked for meanwhile drops more.
	fill := func() {
		t.Helper()
		for before := evicted.Load(); evicted.Load() == before; {
			writeSettled(t, j, "s", next, 200, clock.Now())
			if next += 200; next > 100_000 {
				t.Fatalf("%d hand-offs written, %d bytes in use, and nothing dropped", next, j.inUse())
			}
		}
		if _, err := j.TrimToSize(); err != nil {
			t.Fatal(err)
		}
	}
	warned := func() (lines int, dropped int64) {
		for _, l := range logs.at(slog.LevelWarn) {
			lines++
			dropped += l["dropped"].Int64()
		}
		return lines, dropped
	}
	fill()
	fill()
	if lines, _ := warned(); lines != 1 {
		t.Fatalf("%d Warn lines after two trims within a minute, want 1", lines)
	}
	j.trimToSize() // the tick, within the minute: nothing yet
	if lines, _ := warned(); lines != 1 {
		t.Fatalf("%d Warn lines after a tick within the minute, want 1", lines)
	}
	clock.Advance(time.Minute)
	j.trimToSize() // the tick, a minute on: the second trim's count
	lines, dropped := warned()
	if lines != 2 || dropped != evicted.Load() {
		t.Errorf("%d Warn lines telling of %d dropped, want 2 telling of %d (OnEvict's count)", lines, dropped, evicted.Load())
	}
	for _, l := range logs.at(slog.LevelWarn) {
		if oldest := l["oldest_kept"].Time(); oldest.Before(t0) {
			t.Errorf("oldest_kept %v, want a settle time of a kept hand-off", oldest)
		}
	}
	if errs := logs.at(slog.LevelError); len(errs) != 0 {
		t.Errorf("Error lines with only settled hand-offs over the bound: %v", errs)
	}
}

// The writer finds the bound reached after a commit and asks the compactor
// for a trim: the live data comes back under the bound with no tick (the
// tests' compactor ticks once an hour).
func TestMaxSizeWriterAsksForATrim(t *testing.T) {
	// Rounds of less than a tenth of the bound: what a round writes after
	// a trim that ran during it cannot take the live data back over.
	const maxSize, round = 1 << 20, 100
	var evicted atomic.Int64
	clock := newFakeClock()
	j, _ := openJournal(t, newPath(t), Options{Now: clock.Now, Sync: SyncNone, MaxSize: maxSize,
		OnEvict: func(n int) { evicted.Add(int64(n)) }})
	next := 0
	for evicted.Load() == 0 {
		writeSettled(t, j, "s", next, round, at(0))
		next += round
		if next > 100_000 {
			t.Fatalf("%d hand-offs written, %d bytes in use, and nothing dropped", next, j.inUse())
		}
	}
	// Wait for that trim to end: the next one waits its turn.
	j.trim.mu.Lock()
	used := j.inUse()
	j.trim.mu.Unlock()
	if used >= maxSize {
		t.Errorf("%d bytes in use after the writer's trim, want under %d", used, maxSize)
	}
}

// Dropping goes by the log's order, a value at a time: a hand-off written
// to again after others keeps what came later when its first part goes.
func TestDropGoesByLogOrder(t *testing.T) {
	clock := newFakeClock()
	j, _ := openJournal(t, newPath(t), Options{Now: clock.Now, Sync: SyncNone})
	twice := Key{Source: "twice", EventID: "e"}
	appendOK(t, j, twice, storySettledCopy(at(0))...) // a value of its own
	writeSettled(t, j, "s", 0, 10, at(time.Second))
	later := []Record{{Kind: Received, At: at(time.Minute), Hop: 1}, {Kind: Settled, At: at(time.Minute), Hop: 1, Detail: "handled"}}
	appendOK(t, j, twice, later...)
	req := &dropRequest{bytes: 1} // the oldest value, and no more
	if err := j.await(t.Context(), &request{drop: req, done: make(chan error, 1)}); err != nil {
		t.Fatal(err)
	}
	if req.dropped != 1 {
		t.Errorf("dropped %d hand-offs with the oldest value, want 1", req.dropped)
	}
	if got := timeline(t, j, twice); len(got) != len(later) || !equalRecord(got[0].Record, later[0]) {
		t.Errorf("timeline after its first part was dropped = %+v, want the later %d records", got, len(later))
	}
	if got := kept(t, j, "s"); len(got) != 10 {
		t.Errorf("kept %v, want the 10 written after it", got)
	}
}

// A negative MaxSize turns the bound off; zero is the default.
func TestMaxSizeOptions(t *testing.T) {
	tests := []struct {
		name    string
		maxSize int64
		want    int64
		drops   bool
	}{
		{name: "zero is the default", maxSize: 0, want: DefaultMaxSize},
		{name: "negative is no bound", maxSize: -1, want: -1},
		{name: "a bound", maxSize: 64 << 10, want: 64 << 10, drops: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var evicted atomic.Int64
			j, _ := openJournal(t, newPath(t), Options{Sync: SyncNone, MaxSize: tt.maxSize,
				OnEvict: func(n int) { evicted.Add(int64(n)) }})
			if j.o.MaxSize != tt.want {
				t.Errorf("MaxSize %d, want %d", j.o.MaxSize, tt.want)
			}
			writeSettled(t, j, "s", 0, 1000, at(0))
			if _, err := j.TrimToSize(); err != nil {
				t.Fatal(err)
			}
			if n := evicted.Load(); (n > 0) != tt.drops {
				t.Errorf("%d hand-offs dropped of 1000 (%d bytes in use), want some: %v", n, j.inUse(), tt.drops)
			}
		})
	}
}

// Under a steady load from many writers, the writer's own check keeps the
// live data near the bound between the compactor's ticks (an hour here):
// the peak after any commit is logged, and must stay within a quarter over.
func TestMaxSizeUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 12,800 hand-offs, four times what the bound holds")
	}
	const maxSize, writers, each = 2 << 20, 16, 800
	var (
		jp      atomic.Pointer[Journal]
		peak    atomic.Int64
		evicted atomic.Int64
	)
	path := newPath(t)
	j, _ := openJournal(t, path, Options{Sync: SyncNone, MaxSize: maxSize,
		OnEvict: func(n int) { evicted.Add(int64(n)) },
		OnCommit: func(time.Duration) {
			if j := jp.Load(); j != nil {
				used := j.inUse()
				for p := peak.Load(); used > p && !peak.CompareAndSwap(p, used); p = peak.Load() {
				}
			}
		}})
	jp.Store(j)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				k := Key{Source: "load", EventID: fmt.Sprintf("w%02d-%06d", w, i)}
				if err := j.Append(t.Context(), k, storySettledSuccess(time.Now())...); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	j.trim.mu.Lock()
	used := j.inUse()
	j.trim.mu.Unlock()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	live, file := liveSize(t, path)
	t.Logf("%d hand-offs written, %d dropped; peak live data after a commit %d bytes (%.1f%% of the bound), at the end %d in process, %d in the closed file (%.1f%%); file %d bytes",
		writers*each, evicted.Load(), peak.Load(), 100*float64(peak.Load())/maxSize, used, live, 100*float64(live)/maxSize, file)
	if p := peak.Load(); p > maxSize*5/4 {
		t.Errorf("live data peaked at %d bytes, over a quarter past the bound %d", p, maxSize)
	}
	if live >= maxSize {
		t.Errorf("the closed file holds %d bytes of live data, want under %d", live, maxSize)
	}
}

// BenchmarkAppendMaxSize is BenchmarkAppend's settled hand-offs with and
// without a bound that they reach: the writer's check after each commit,
// and the trims, are the difference. A bounded run reports the peak of the
// live data after any commit, against the bound, and the file's size.
func BenchmarkAppendMaxSize(b *testing.B) {
	for _, m := range []struct {
		name string
		sync SyncMode
		max  int64
	}{
		{"none/unbounded", SyncNone, -1},
		{"none/16MiB", SyncNone, 16 << 20},
		{"batch/unbounded", SyncBatch, -1},
		{"batch/16MiB", SyncBatch, 16 << 20},
	} {
		b.Run(m.name, func(b *testing.B) {
			var (
				jp   atomic.Pointer[Journal]
				peak atomic.Int64
			)
			o := Options{Sync: m.sync, MaxSize: m.max}
			if m.max > 0 {
				o.OnCommit = func(time.Duration) {
					if j := jp.Load(); j != nil {
						used := j.inUse()
						for p := peak.Load(); used > p && !peak.CompareAndSwap(p, used); p = peak.Load() {
						}
					}
				}
			}
			path := filepath.Join(b.TempDir(), "journal.db")
			j, _, err := Open(path, testOptions(o))
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			jp.Store(j)
			var next atomic.Uint64
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					k := Key{Source: "bench", EventID: fmt.Sprint(next.Add(1))}
					if err := j.Append(b.Context(), k, storySettledSuccess(time.Now())...); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handoffs/s")
			if m.max > 0 {
				b.ReportMetric(100*float64(peak.Load())/float64(m.max), "peak-%-of-bound")
			} else {
				b.ReportMetric(float64(j.inUse())/float64(b.N), "B-in-use/handoff")
			}
			if fi, err := os.Stat(path); err == nil {
				b.ReportMetric(float64(fi.Size())/(1<<20), "file-MiB")
			}
		})
	}
}
