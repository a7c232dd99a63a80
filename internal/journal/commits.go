package journal

import (
	"slices"
	"sync"
	"time"
)

// commitWindow is how many of the latest group commits CommitLatency reads.
const commitWindow = 256

// commits keeps the durations of the latest group commits. It is safe for
// concurrent use: the writer records, operators read.
type commits struct {
	mu   sync.Mutex
	ring [commitWindow]time.Duration
	n    int // commits recorded, ever
}

func (c *commits) record(d time.Duration) {
	c.mu.Lock()
	c.ring[c.n%commitWindow] = d
	c.n++
	c.mu.Unlock()
}

// CommitLatency is how long the latest group commits took (the last 256 at
// most): their median and the slowest, and how many were read; zero before
// the first commit.
type CommitLatency struct {
	P50, Max time.Duration
	N        int
}

func (c *commits) latency() CommitLatency {
	c.mu.Lock()
	n := min(c.n, commitWindow)
	ds := slices.Clone(c.ring[:n])
	c.mu.Unlock()
	if n == 0 {
		return CommitLatency{}
	}
	slices.Sort(ds)
	return CommitLatency{P50: ds[(n-1)/2], Max: ds[n-1], N: n}
}
