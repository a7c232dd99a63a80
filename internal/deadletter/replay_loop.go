package deadletter

import (
	"context"
	"errors"
	"slices"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// The manager's loop: the replays it runs or adopts, and the outcomes of
// replayed copies recorded in their ledgers.

// recordBound bounds how long recording a handled replayed copy's outcome
// holds its ack.
const recordBound = 10 * time.Second

// Handled is told by the engine that the app handled a replayed copy: one
// whose trail names the dead letter it replays (broker.Trail.ReplayOf) and
// its replay id. It records Complete in the ledger before it returns, and
// the engine acks the copy after: a crash in between leaves a redelivery,
// which the engine settles as handled and reports again. It returns within
// recordBound, even while the sidecar stops; a failure is logged and the
// letter stays replaying.
func (m *Manager) Handled(ctx context.Context, source string, t broker.Trail) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordBound)
	defer cancel()
	m.recordHandled(ctx, handled{source: source, trail: t})
}

type handled struct {
	source string
	trail  broker.Trail
}

// recordHandled appends Complete for a handled replayed copy, once the
// ledger shows the run that replayed it: a copy whose headers name a dead
// letter and a run that never replayed it changes nothing.
func (m *Manager) recordHandled(ctx context.Context, h handled) {
	src, err := m.source(h.source)
	if err != nil {
		return
	}
	id, err := ParseID(h.trail.ReplayOf)
	if err != nil || id.Log != src.DLQ.Name() {
		m.log.Warn("handled copy names a dead letter not of its source", "source", h.source, "replay_of", h.trail.ReplayOf)
		return
	}
	for try := 0; ; try++ {
		run, err := m.o.Index.runOnly(h.trail.ReplayID)
		if err == nil && slices.Contains(run.Spec.IDs, id.String()) {
			break
		}
		if try == 2 || ctx.Err() != nil {
			m.log.Warn("handled copy names a replay the ledger does not hold for its dead letter: not recorded",
				"dead_letter", id.String(), "replay", h.trail.ReplayID)
			return
		}
		if err := m.o.Index.catchUpLedger(ctx, src.Source, ""); err != nil {
			m.log.Warn("reading the ledger", "source", src.Name, "err", err)
		}
	}
	for try := 0; ctx.Err() == nil; try++ {
		// Not read back: the ack waits for this, and the record stands or
		// falls by the ledger's order whoever reads it.
		err := m.o.Index.AppendOnly(ctx, src.Source, Change{ID: id, Transition: Complete, Who: m.o.Replica,
			Why: "the app handled the replayed copy", ReplayID: h.trail.ReplayID})
		switch {
		case err == nil:
			return
		case errors.Is(err, ErrIllegal) || errors.Is(err, ErrLost) || errors.Is(err, ErrNotFound):
			// Closed already (a duplicate copy handled twice), or terminated.
			m.log.Info("replayed copy handled; its dead letter was closed already", "dead_letter", id.String(), "err", err)
			return
		}
		m.log.Warn("recording a replayed copy's outcome failed; trying again", "dead_letter", id.String(), "err", err)
		if !sleep(ctx, min(time.Duration(try+1)*m.o.Poll, time.Second)) {
			m.log.Warn("a replayed copy's outcome is not recorded: its dead letter stays replaying",
				"dead_letter", id.String(), "replay", h.trail.ReplayID)
			return
		}
	}
}

// sleep waits d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Run keeps the index caught up with every source's logs and drives the
// replay runs this replica holds or takes over, until ctx ends; it returns
// nil then, once its runners stopped. A catch-up that
// fails (a broker unreachable) is logged and tried again.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	m.ctx = ctx
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		rs := make([]*runner, 0, len(m.running))
		for _, r := range m.running {
			rs = append(rs, r)
		}
		m.mu.Unlock()
		for _, r := range rs {
			<-r.done
		}
	}()
	counted := map[string]Counts{}
	failing := map[string]string{} // source → its catch-up's last error
	for {
		for i := range m.o.Sources {
			src := &m.o.Sources[i]
			c, err := m.o.Index.CatchUp(ctx, src.Source)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				// Said once per error, not once a poll: a broker down or
				// refusing the sidecar is said by the source as well.
				if failing[src.Name] != err.Error() {
					m.log.Warn("dead-letter index: catching up failed; trying again every poll", "source", src.Name, "err", err)
				} else {
					m.log.Debug("dead-letter index: catching up failed again", "source", src.Name, "err", err)
				}
				failing[src.Name] = err.Error()
				continue
			}
			if _, ok := failing[src.Name]; ok {
				m.log.Info("dead-letter index: catching up again", "source", src.Name)
				delete(failing, src.Name)
			}
			if c.Letters > 0 || c.Records > 0 || c.Expired > 0 {
				m.log.Debug("dead-letter index caught up", "source", src.Name, "letters", c.Letters, "records", c.Records,
					"refused", c.Refused, "expired", c.Expired)
			}
			m.report(src.Name, counted)
			m.adopt(ctx, src)
		}
		if !sleep(ctx, m.o.Poll) {
			return nil
		}
	}
}

// report logs a source's open dead letters when their count changes: the
// figure an operator watches, with the oldest one's age.
func (m *Manager) report(source string, last map[string]Counts) {
	c, err := m.o.Index.Counts(source)
	if err != nil {
		return
	}
	if prev, ok := last[source]; ok && prev.Open == c.Open && prev.ByState[Expired] == c.ByState[Expired] {
		return
	}
	last[source] = c
	args := []any{"source", source, "open", c.Open}
	if !c.OldestOpen.IsZero() {
		args = append(args, "oldest_open_age", m.now().Sub(c.OldestOpen).Round(time.Second))
	}
	for _, s := range States {
		if n := c.ByState[s]; n > 0 {
			args = append(args, string(s), n)
		}
	}
	m.log.Info("dead letters", args...)
}

// adopt claims the source's running runs that no replica drives: those
// without a runner, those this replica ran before it restarted, and those
// whose runner's heartbeat is older than the run's TTL.
func (m *Manager) adopt(ctx context.Context, src *ManagedSource) {
	runs, err := m.o.Index.Runs(src.Name)
	if err != nil {
		return
	}
	now := m.now()
	for _, run := range runs {
		if run.Ended() {
			continue
		}
		m.mu.Lock()
		_, mine := m.running[run.ID]
		m.mu.Unlock()
		if mine {
			continue
		}
		if run.Runner != "" && run.Runner != m.o.Replica && now.Sub(run.HeartbeatAt) <= run.Spec.HeartbeatTTL {
			continue
		}
		if run.Runner != "" && run.Runner != m.o.Replica {
			m.log.Warn("taking over a replay whose runner stopped", "replay", run.ID, "runner", run.Runner,
				"last_heartbeat", run.HeartbeatAt)
		}
		if err := m.claim(ctx, src, run.ID); err != nil && ctx.Err() == nil {
			m.log.Warn("claiming a replay failed", "replay", run.ID, "err", err)
		}
	}
}
