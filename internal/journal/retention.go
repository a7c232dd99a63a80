package journal

import (
	"context"
	"time"
)

func (j *Journal) compactor() {
	defer j.wg.Done()
	t := time.NewTicker(j.o.CompactEvery)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-j.trimNow:
			j.trimToSize()
			continue
		case <-t.C:
		}
		if n, err := j.Compact(); err != nil {
			j.log.Warn("journal compaction failed", "err", err)
		} else if n > 0 {
			j.log.Debug("journal compacted", "removed", n)
		}
		j.trimToSize()
	}
}

// trimToSize is TrimToSize for the compactor, which also tells what a
// trim within the last minute held back.
func (j *Journal) trimToSize() {
	if _, err := j.TrimToSize(); err != nil {
		j.log.Warn("journal: dropping settled history to keep within journal.max_size failed", "err", err)
	}
	j.trim.mu.Lock()
	j.warnDropped(j.now(), -1)
	j.trim.mu.Unlock()
}

// Compact drops the history older than Retention: the log's values
// committed before then, with the hand-offs settled in them, and the open
// hand-offs whose latest record is that old too (their settle record was
// lost, or their message never came back). An open hand-off with a
// later record is written again at the log's end first, whole. It
// returns how many hand-offs it dropped.
func (j *Journal) Compact() (int, error) {
	if j.o.ReadOnly {
		return 0, nil
	}
	cutoff := j.now().Add(-j.o.Retention)
	total := 0
	for {
		req := &dropRequest{cutoff: cutoff}
		err := j.await(context.Background(), &request{drop: req, done: make(chan error, 1)})
		total += req.dropped
		if err != nil || !req.more {
			return total, err
		}
	}
}
