package journal

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkAppend appends one three-record hand-off per op from many
// goroutines, as dispatch does under load. With SyncBatch it also reports
// how long each Append waited: group commit trades latency for fsyncs.
func BenchmarkAppend(b *testing.B) {
	modes := []struct {
		name string
		sync SyncMode
	}{
		{name: "always", sync: SyncAlways},
		{name: "batch", sync: SyncBatch},
		{name: "none", sync: SyncNone},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "journal.db")
			j, _, err := Open(path, testOptions(Options{Sync: m.sync}))
			if err != nil {
				b.Fatal(err)
			}
			defer j.Close()
			measure := m.sync == SyncBatch
			var (
				next      atomic.Uint64
				mu        sync.Mutex
				latencies []time.Duration
			)
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				for pb.Next() {
					k := Key{Source: "bench", EventID: fmt.Sprint(next.Add(1))}
					start := time.Now()
					err := j.Append(b.Context(), k,
						Record{Kind: Received},
						Record{Kind: Attempt, Attempt: 1},
						Record{Kind: Outcome, Attempt: 1, Outcome: outSuccess, Status: 200, Latency: time.Millisecond})
					if err != nil {
						b.Error(err)
						return
					}
					if measure {
						mine = append(mine, time.Since(start))
					}
				}
				mu.Lock()
				latencies = append(latencies, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N*3)/b.Elapsed().Seconds(), "records/s")
			if measure && len(latencies) > 0 {
				slices.Sort(latencies)
				pct := func(p float64) float64 {
					return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds())
				}
				b.ReportMetric(pct(0.50), "p50-µs")
				b.ReportMetric(pct(0.99), "p99-µs")
			}
		})
	}
}

// BenchmarkDecode measures reading one record back, the cost State pays per
// record.
func BenchmarkDecode(b *testing.B) {
	r := fullRecord()
	enc := r.Encode(nil)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(enc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkState measures the fold dispatch runs for every delivery.
func BenchmarkState(b *testing.B) {
	path := filepath.Join(b.TempDir(), "journal.db")
	j, _, err := Open(path, testOptions(Options{Sync: SyncNone}))
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	const keys = 1000
	for i := range keys {
		if err := j.Append(b.Context(), Key{Source: "bench", EventID: fmt.Sprint(i)}, storySettledCopy(at(0))...); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := j.State(Key{Source: "bench", EventID: fmt.Sprint(i % keys)}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkHandoffs runs the journal's share of the common path, as dispatch
// does it for each message, from many goroutines: State, then RECEIVED,
// ATTEMPT, OUTCOME and SETTLED in one request once the call has answered,
// waited for (dispatch's settleLater). The journal already
// holds a backlog of settled hand-offs, so each commit lands in a tree of
// realistic size. Event ids are random, like UUIDs, or counted ("m-1",
// "m-2", …), like a producer numbering its messages. It reports hand-offs a
// second and the live data each adds to the file.
func BenchmarkHandoffs(b *testing.B) {
	for _, ids := range []string{"random", "counted"} {
		b.Run("ids="+ids, func(b *testing.B) { benchHandoffs(b, ids, backlogSize) })
	}
}

// BenchmarkHandoffsFull is BenchmarkHandoffs on a journal at its default
// max_size, where a sidecar that has run for a while stays: some thirty
// index segments to look an event up in, and the oldest hand-offs dropped
// as new ones come.
func BenchmarkHandoffsFull(b *testing.B) {
	benchHandoffs(b, "random", fullBacklogSize)
}

func benchHandoffs(b *testing.B, ids string, size int) {
	// The backlog is written once and copied for each run of the
	// benchmark: the framework runs it several times.
	path := filepath.Join(b.TempDir(), "journal.db")
	if err := copyFile(backlog(b, ids, size), path); err != nil {
		b.Fatal(err)
	}
	var commits, records atomic.Int64
	j, _, err := Open(path, testOptions(Options{Sync: SyncBatch, BeforeCommit: func(n int) error {
		commits.Add(1)
		records.Add(int64(n))
		return nil
	}}))
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	before, err := j.Stats()
	if err != nil {
		b.Fatal(err)
	}
	// The ids are made before the clock starts: a delivery brings
	// its own, and making one is not the journal's work.
	keys := make([]Key, b.N)
	for i := range keys {
		keys[i] = Key{Source: "bench", EventID: eventID(ids, uint64(size+i))}
	}
	var n atomic.Int64
	// 256 hand-offs in flight, Kafka's default window: with a
	// durable commit per batch, what waits is what one commit holds.
	b.SetParallelism(max(1, handoffsInFlight/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	cpu := startCPU()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := benchHandoff(b.Context(), j, keys[n.Add(1)-1]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	cpu.report(b)
	after, err := j.Stats()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handoffs/s")
	// The live data the run added, pages of the records, the
	// indexes and the tree's own: what a hand-off costs on disk.
	b.ReportMetric(float64(after.InUse-before.InUse)/float64(b.N), "bytes/handoff")
	b.ReportMetric(float64(records.Load())/float64(max(commits.Load(), 1)), "records/commit")
}

const backlogSize = 50000

// fullBacklogSize is about what DefaultMaxSize holds, at some 135 bytes a
// hand-off.
const fullBacklogSize = 2_000_000

// handoffsInFlight is how many hand-offs BenchmarkHandoffs keeps waiting on
// the journal at once.
const handoffsInFlight = 256

// cpuClock reads the process's CPU time (user and system) over a benchmark,
// the cost of an op whatever the machine's other load does to wall time.
type cpuClock struct{ start time.Duration }

func startCPU() cpuClock { return cpuClock{processCPU()} }

// report adds the CPU time per op since start as cpu-ns/op.
func (c cpuClock) report(b *testing.B) {
	b.ReportMetric(float64(processCPU()-c.start)/float64(b.N), "cpu-ns/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchHandoff is the journal's share of one message's common path.
func benchHandoff(ctx context.Context, j *Journal, k Key) error {
	if _, err := j.State(k); err != nil {
		return err
	}
	// A first delivery's RECEIVED and ATTEMPT go with its outcome, and the
	// settle with them, ahead of the ack (dispatch's attempts and
	// settleLater): one request and one part for the four.
	return j.Append(ctx, k, Record{Kind: Received}, Record{Kind: Attempt, Attempt: 1},
		Record{Kind: Outcome, Attempt: 1, Outcome: outSuccess, Status: 200, Latency: time.Millisecond},
		Record{Kind: Settled, Detail: "handled"})
}

// eventID is the i-th event id: random-looking (a bijection, so unique),
// like a UUID, or counted.
func eventID(ids string, i uint64) string {
	if ids == "counted" {
		return fmt.Sprint("m-", i)
	}
	v := i * 0x9e3779b97f4a7c15
	return fmt.Sprintf("%016x-%016x", v, v^0x5851f42d4c957f2d)
}

var (
	backlogMu    sync.Mutex
	backlogFiles = map[string]string{}
)

// backlog returns a journal file holding size settled hand-offs with
// ids of the given kind, written once per test binary.
func backlog(b *testing.B, ids string, size int) string {
	backlogMu.Lock()
	defer backlogMu.Unlock()
	name := fmt.Sprint(ids, size)
	if path, ok := backlogFiles[name]; ok {
		return path
	}
	dir, err := os.MkdirTemp("", "journal-backlog-")
	if err != nil {
		b.Fatal(err)
	}
	benchDirs = append(benchDirs, dir)
	path := filepath.Join(dir, "journal.db")
	j, _, err := Open(path, testOptions(Options{Sync: SyncNone}))
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < size; i += 64 {
				if err := benchHandoff(context.Background(), j, Key{Source: "bench", EventID: eventID(ids, uint64(i))}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := j.Close(); err != nil {
		b.Fatal(err)
	}
	backlogFiles[name] = path
	return path
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o600)
}
