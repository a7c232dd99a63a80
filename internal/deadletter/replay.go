package deadletter

import (
	"context"
	"errors"
	"fmt"
	"time"
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
	// Held: an operator paused the run (OpPause) and has not resumed it;
	// HeldWhy says who and why. The runner publishes nothing meanwhile.
	Held    bool   `json:"held,omitempty"`
	HeldWhy string `json:"held_why,omitempty"`
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
	return m.operate(ctx, id, OpCancel, who, why)
}

// PauseReplay records that an operator paused a run: its runner publishes
// nothing more until ResumeReplay. What was published stays published, and
// its outcomes still come in.
func (m *Manager) PauseReplay(ctx context.Context, id, who, why string) (Run, error) {
	return m.operate(ctx, id, OpPause, who, why)
}

// ResumeReplay records that an operator let a paused run go on.
func (m *Manager) ResumeReplay(ctx context.Context, id, who, why string) (Run, error) {
	return m.operate(ctx, id, OpResume, who, why)
}

// operate records an operator's cancel, pause or resume of a run, and
// refuses one that would change nothing: any of a run that ended, a pause
// of a paused run, a resume of one not paused by hand.
func (m *Manager) operate(ctx context.Context, id string, op RunOp, who, why string) (Run, error) {
	run, err := m.o.Index.Run(id)
	if err != nil {
		return Run{}, err
	}
	switch {
	case run.Ended():
		return run, fmt.Errorf("%w: replay %s is %s already", ErrIllegal, id, run.State)
	case op == OpPause && run.Held:
		return run, fmt.Errorf("%w: replay %s is paused already (%s)", ErrIllegal, id, run.HeldWhy)
	case op == OpResume && !run.Held:
		return run, fmt.Errorf("%w: replay %s was not paused by hand", ErrIllegal, id)
	}
	src, err := m.source(run.Source)
	if err != nil {
		return Run{}, err
	}
	rec := RunRecord{Version: RecordVersion, Kind: KindRun, Run: id, Op: op, Who: who, At: m.now().UTC(), Why: why}
	if run, err = m.appendRun(ctx, src, rec); err != nil {
		return run, err
	}
	// Another record may have come first in the ledger's order: the run
	// ended, or someone else paused or resumed it.
	switch {
	case op == OpCancel && run.State != RunCancelled:
		return run, fmt.Errorf("%w: replay %s is %s", ErrLost, id, run.State)
	case op != OpCancel && (run.Held != (op == OpPause) || op == OpPause && run.HeldWhy != byWhom("paused", &rec)):
		return run, fmt.Errorf("%w: replay %s is %s (held %t: %s)", ErrLost, id, run.State, run.Held, run.HeldWhy)
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
