package journal

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
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
