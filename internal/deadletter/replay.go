package deadletter

import (
	"context"
	"errors"
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
	// Remaining: still to publish.
	Remaining int
	// Skipped: not to be published: closed, or not approved when the run
	// reached it.
	Skipped int
	// ETA is when the remaining will have been published, at the run's rate.
	ETA time.Duration
	// Rate is the measured publish rate so far (per second).
	Rate float64
}

// ErrNoRun is returned for a replay id no ledger holds.
var ErrNoRun = errors.New("no such replay")

// CreateReplay resolves r's selection and, unless r.DryRun, records a new
// run in the source's ledger; a replica (this one first) then drives it.
func (m *Manager) CreateReplay(ctx context.Context, r ReplayRequest) (Run, error) {
	return Run{}, errors.New("not yet")
}

// Replay returns a run with its progress.
func (m *Manager) Replay(id string) (Run, error) {
	return Run{}, ErrNoRun
}

// Replays returns the runs of source (every source when empty), newest
// first, with their progress.
func (m *Manager) Replays(source string) ([]Run, error) {
	return nil, nil
}

// CancelReplay records that a run is cancelled; its runner stops before its
// next publish.
func (m *Manager) CancelReplay(ctx context.Context, id, who, why string) (Run, error) {
	return Run{}, ErrNoRun
}

// Handled is told by the engine that the app handled a replayed copy: one
// whose trail names the dead letter it replays (broker.Trail.ReplayOf) and
// its replay id. It records Complete in the ledger in the background, and
// never blocks.
func (m *Manager) Handled(source string, t broker.Trail) {}

// Run keeps the index caught up with every source's logs and drives the
// replay runs this replica holds, until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

type runner struct{}
