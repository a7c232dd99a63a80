package deadletter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// ReplayRequest asks for a replay run.
type ReplayRequest struct {
	// IDs selects dead letters by id; otherwise Filter does (its Source is
	// required then, its States default to Approved; its paging fields are
	// ignored).
	IDs    []ID
	Filter Filter
	// Force replays pending dead letters too, approving each on the way.
	Force bool
	// Rate is the messages published per second; DefaultReplayRate when 0.
	Rate float64
	// BatchSize is how many are published between two checks of the stop
	// threshold, a cancel and the app's pressure; DefaultReplayBatch when 0.
	BatchSize int
	// Sample is how many are published first; then the run waits for their
	// outcomes (up to SampleTimeout) before it goes on. 0: no sample.
	Sample        int
	SampleTimeout time.Duration
	// StopFailureRatio stops the run when more than this share of the
	// replayed copies' known outcomes are failures; DefaultStopFailureRatio
	// when 0, and 1 never stops.
	StopFailureRatio float64
	// DryRun returns what would be replayed and starts nothing.
	DryRun bool
	// Who asks (the admin token's subject) and why.
	Who, Why string
}

// Defaults of a ReplayRequest.
const (
	DefaultReplayRate       = 10.0
	DefaultReplayBatch      = 10
	DefaultStopFailureRatio = 0.5
	DefaultSampleTimeout    = 5 * time.Minute
	// MaxReplaySelection bounds the ids one run names: they are written in
	// its first ledger record, which stays under a broker's message limit.
	MaxReplaySelection = 20000
)

// RunState is where a replay run is.
type RunState string

// The states of a replay run.
const (
	// RunRunning: created and not ended; a replica drives it.
	RunRunning RunState = "running"
	// RunCompleted: every selected dead letter was published or skipped.
	RunCompleted RunState = "completed"
	// RunStopped: the stop threshold was passed, or the sample's outcomes
	// did not come in time.
	RunStopped RunState = "stopped"
	// RunCancelled: cancelled by hand.
	RunCancelled RunState = "cancelled"
	// RunDryRun is the state of a dry run's answer: nothing was recorded,
	// and no run has its id.
	RunDryRun RunState = "dry-run"
)

// Run is a replay run as every replica derives it from the ledger.
type Run struct {
	// ID is the replay id each replayed copy carries.
	ID     string   `json:"id"`
	Source string   `json:"source"`
	State  RunState `json:"state"`
	// Detail says why the run ended, or why it is paused now.
	Detail string `json:"detail,omitempty"`
	Paused bool   `json:"paused,omitempty"`
	// Runner is the replica driving it, and HeartbeatAt its last heartbeat.
	Runner      string    `json:"runner,omitempty"`
	HeartbeatAt time.Time `json:"heartbeat_at,omitzero"`
	CreatedBy   string    `json:"created_by"`
	CreatedAt   time.Time `json:"created_at"`
	EndedAt     time.Time `json:"ended_at,omitzero"`
	Why         string    `json:"why,omitempty"`
	Spec        RunSpec   `json:"spec"`
	// Progress is computed from the selected letters' states; not stored.
	Progress Progress `json:"-"`
	// DryRun marks the answer of a dry run: nothing was recorded.
	DryRun bool `json:"-"`
}

// Ended reports whether the run is over.
func (r *Run) Ended() bool { return r.State != RunRunning }

// RunSpec is what a run was asked to do, fixed when it was created.
type RunSpec struct {
	// IDs are the selected dead letters, resolved when the run was created,
	// in the order they are published.
	IDs              []string      `json:"ids"`
	Force            bool          `json:"force,omitempty"`
	Rate             float64       `json:"rate"`
	BatchSize        int           `json:"batch_size"`
	Sample           int           `json:"sample,omitempty"`
	SampleTimeout    time.Duration `json:"sample_timeout,omitempty"`
	StopFailureRatio float64       `json:"stop_failure_ratio"`
	// HeartbeatTTL is how long the runner may go without a heartbeat before
	// another replica takes the run over; every reader applies the same.
	HeartbeatTTL time.Duration `json:"heartbeat_ttl"`
}

// Progress is how far a run is, read from its letters' states.
type Progress struct {
	Selected int
	// Published: the copy was confirmed and its Replay record is in the
	// ledger (or its outcome is).
	Published int
	// Handled: the app handled the replayed copy.
	Handled int
	// Failed: the replayed copy became a new dead letter.
	Failed int
	// Remaining: still approved and not published: to publish while the
	// run runs; left unpublished once it ended (a later run may take them).
	Remaining int
	// Skipped: not to be published: closed, or not approved when the run
	// reached it.
	Skipped int
	// ETA is when the remaining will have been published, at the run's rate.
	ETA time.Duration
	// Rate is the measured publish rate (per second) over the run's recent
	// publishing, its last RateWindow of publishes: the pace it keeps, which
	// its waits do not lower.
	Rate float64
	// Waited is how long the run went without publishing so far, between
	// publishes: the sample's wait, pauses, a takeover.
	Waited time.Duration
}

// RateWindow is the stretch of a run's latest publishes its Rate is
// measured over.
const RateWindow = 10 * time.Second

// ErrNoRun is returned for a replay id no ledger holds.
var ErrNoRun = errors.New("no such replay")

// CreateReplay resolves r's selection and, unless r.DryRun, records a new
// run in the source's ledger; this replica drives it, and another takes it
// over if this one stops.
func (m *Manager) CreateReplay(ctx context.Context, r ReplayRequest) (Run, error) {
	spec, src, err := m.resolve(r)
	if err != nil {
		return Run{}, err
	}
	now := m.now().UTC()
	run := Run{ID: newReplayID(now), Source: src.Name, State: RunRunning, CreatedBy: r.Who, CreatedAt: now, Why: r.Why, Spec: spec}
	if r.DryRun {
		run.DryRun, run.State = true, RunDryRun
		run.Progress = Progress{Selected: len(spec.IDs), Remaining: len(spec.IDs),
			ETA: time.Duration(float64(len(spec.IDs)) / spec.Rate * float64(time.Second))}
		return run, nil
	}
	// Held by this replica from its first record: no other claims it
	// before this one starts.
	rec := RunRecord{Version: RecordVersion, Kind: KindRun, Run: run.ID, Op: OpCreate, Who: r.Who, At: now, Why: r.Why,
		Spec: &spec, Runner: m.o.Replica}
	created, err := m.appendRun(ctx, src, rec)
	if err != nil {
		return Run{}, err
	}
	m.start(src, created)
	return m.o.Index.Run(run.ID)
}

// resolve checks a request and resolves its selection into a spec.
func (m *Manager) resolve(r ReplayRequest) (RunSpec, *ManagedSource, error) {
	spec := RunSpec{
		Force: r.Force, Rate: r.Rate, BatchSize: r.BatchSize, Sample: r.Sample, SampleTimeout: r.SampleTimeout,
		StopFailureRatio: r.StopFailureRatio, HeartbeatTTL: m.o.HeartbeatTTL,
	}
	if spec.Rate == 0 {
		spec.Rate = DefaultReplayRate
	}
	if spec.BatchSize == 0 {
		spec.BatchSize = DefaultReplayBatch
	}
	if spec.StopFailureRatio == 0 {
		spec.StopFailureRatio = DefaultStopFailureRatio
	}
	if spec.Sample > 0 && spec.SampleTimeout == 0 {
		spec.SampleTimeout = DefaultSampleTimeout
	}
	switch {
	case !(spec.Rate > 0) || spec.Rate > 100000:
		return spec, nil, fmt.Errorf("%w: rate %v: want more than 0 and at most 100000 a second", ErrBadRequest, r.Rate)
	case spec.BatchSize < 1 || spec.BatchSize > 10000:
		return spec, nil, fmt.Errorf("%w: batch size %d: want 1 to 10000", ErrBadRequest, r.BatchSize)
	case spec.Sample < 0 || spec.SampleTimeout < 0:
		return spec, nil, fmt.Errorf("%w: sample %d in %v", ErrBadRequest, r.Sample, r.SampleTimeout)
	case !(spec.StopFailureRatio > 0 && spec.StopFailureRatio <= 1):
		return spec, nil, fmt.Errorf("%w: stop failure ratio %v: want more than 0 and at most 1", ErrBadRequest, r.StopFailureRatio)
	case r.Who == "":
		return spec, nil, fmt.Errorf("%w: no one asked", ErrBadRequest)
	}
	run := Run{Spec: spec}
	var src *ManagedSource
	if len(r.IDs) > 0 {
		seen := map[ID]bool{}
		for _, id := range r.IDs {
			s, err := m.sourceOf(id)
			if err != nil {
				return spec, nil, err
			}
			if src != nil && s != src {
				return spec, nil, fmt.Errorf("%w: %s and %s are dead letters of different sources: one run replays one source", ErrBadRequest, r.IDs[0], id)
			}
			src = s
			l, err := m.o.Index.Get(id)
			if err != nil {
				return spec, nil, err
			}
			if !run.replayable(&l) {
				if l.State == Pending {
					return spec, nil, fmt.Errorf("%w: %s is pending: approve it first, or force the replay", ErrIllegal, id)
				}
				return spec, nil, fmt.Errorf("%w: %s is %s: only approved dead letters are replayed", ErrIllegal, id, l.State)
			}
			if !seen[id] {
				seen[id] = true
				spec.IDs = append(spec.IDs, id.String())
			}
		}
	} else {
		if r.Filter.Source == "" {
			return spec, nil, fmt.Errorf("%w: select dead letters by id, or by source (with reason, time and states)", ErrBadRequest)
		}
		var err error
		if src, err = m.source(r.Filter.Source); err != nil {
			return spec, nil, err
		}
		f := r.Filter
		if len(f.States) == 0 {
			f.States = []State{Approved}
			if r.Force {
				f.States = append(f.States, Pending)
			}
		}
		for _, st := range f.States {
			if st != Approved && !(st == Pending && r.Force) {
				return spec, nil, fmt.Errorf("%w: a replay selects approved dead letters (and pending ones when forced), not %s", ErrBadRequest, st)
			}
		}
		f.After, f.Limit = "", MaxLimit
		for {
			p, err := m.o.Index.List(f)
			if err != nil {
				return spec, nil, err
			}
			for _, l := range p.Letters {
				spec.IDs = append(spec.IDs, l.ID.String())
			}
			if len(spec.IDs) > MaxReplaySelection {
				return spec, nil, fmt.Errorf("%w: more than %d dead letters selected: narrow the selection (time range, reason)", ErrBadRequest, MaxReplaySelection)
			}
			if p.Next == "" {
				break
			}
			f.After = p.Next
		}
	}
	if len(spec.IDs) == 0 {
		return spec, nil, fmt.Errorf("%w: nothing selected", ErrNotFound)
	}
	return spec, src, nil
}

// ErrBadRequest is returned for a request that cannot be carried out as
// asked.
var ErrBadRequest = errors.New("bad request")

// newReplayID is a replay id: sortable by its creation, unique.
func newReplayID(now time.Time) string {
	return "replay-" + now.Format("20060102T150405Z") + "-" + newNonce()[:8]
}

// Replay returns a run with its progress.
func (m *Manager) Replay(id string) (Run, error) { return m.o.Index.Run(id) }

// Replays returns the runs of source (every source when empty), newest
// first, with their progress.
func (m *Manager) Replays(source string) ([]Run, error) {
	if source != "" {
		if _, err := m.source(source); err != nil {
			return nil, err
		}
	}
	return m.o.Index.Runs(source)
}

// CancelReplay records that a run is cancelled; its runner stops before its
// next publish. What was published stays published.
func (m *Manager) CancelReplay(ctx context.Context, id, who, why string) (Run, error) {
	run, err := m.o.Index.Run(id)
	if err != nil {
		return Run{}, err
	}
	if run.Ended() {
		return run, fmt.Errorf("%w: replay %s is %s already", ErrIllegal, id, run.State)
	}
	src, err := m.source(run.Source)
	if err != nil {
		return Run{}, err
	}
	rec := RunRecord{Version: RecordVersion, Kind: KindRun, Run: id, Op: OpCancel, Who: who, At: m.now().UTC(), Why: why}
	if run, err = m.appendRun(ctx, src, rec); err != nil {
		return run, err
	}
	if run.State != RunCancelled {
		return run, fmt.Errorf("%w: replay %s is %s", ErrLost, id, run.State)
	}
	return run, nil
}

// appendRun appends a run record and returns the run once the index read it.
func (m *Manager) appendRun(ctx context.Context, src *ManagedSource, r RunRecord) (Run, error) {
	r.Nonce = newNonce()
	body, err := r.Encode()
	if err != nil {
		return Run{}, err
	}
	if err := m.o.Index.appendRead(ctx, src.Source, body, r.Nonce); err != nil {
		return Run{}, err
	}
	return m.o.Index.Run(r.Run)
}

// claim writes a heartbeat for the run, which makes this replica its runner
// when no other holds it, and starts driving it if so.
func (m *Manager) claim(ctx context.Context, src *ManagedSource, id string) error {
	run, err := m.appendRun(ctx, src, RunRecord{Version: RecordVersion, Kind: KindRun, Run: id, Op: OpHeartbeat, Who: m.o.Replica, At: m.now().UTC()})
	if err != nil {
		return err
	}
	m.start(src, run)
	return nil
}

// start drives run on this replica when the ledger says this replica holds
// it and no runner of this replica drives it yet.
func (m *Manager) start(src *ManagedSource, run Run) {
	if run.Ended() || run.Runner != m.o.Replica {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.running[run.ID]; ok || m.ctx == nil {
		return
	}
	r := &runner{m: m, src: src, id: run.ID, done: make(chan struct{})}
	m.running[run.ID] = r
	m.log.Info("driving replay", "replay", run.ID, "source", src.Name, "selected", len(run.Spec.IDs))
	go r.drive(m.ctx)
}

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
