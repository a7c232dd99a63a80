package deadletter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// KindRun is the kind of a record about a replay run: its creation, its
// runner's heartbeats, its end or its cancellation. They share the ledger
// with the transitions, so that one order decides both, and a run is seen
// the same by every replica.
const KindRun = "run"

// RunOp is what a run record says.
type RunOp string

// The run records.
const (
	// OpCreate starts a run: who asked, why, and its Spec.
	OpCreate RunOp = "create"
	// OpHeartbeat is written by the replica driving a run, every third of
	// its heartbeat TTL; one written by another replica claims the run
	// when the runner's last heartbeat is older than the TTL.
	OpHeartbeat RunOp = "heartbeat"
	// OpEnd is written by the runner when the run completed or stopped.
	OpEnd RunOp = "end"
	// OpCancel is written by an operator.
	OpCancel RunOp = "cancel"
	// OpPause is written by an operator: the runner publishes nothing more
	// until an OpResume.
	OpPause RunOp = "pause"
	// OpResume is written by an operator: a paused run goes on.
	OpResume RunOp = "resume"
)

// RunRecord is one record about a replay run.
type RunRecord struct {
	Version int    `json:"v"`
	Kind    string `json:"kind"`
	// Run is the replay id.
	Run   string    `json:"run"`
	Op    RunOp     `json:"op"`
	Who   string    `json:"who"`
	At    time.Time `json:"at"`
	Why   string    `json:"why,omitempty"`
	Nonce string    `json:"nonce,omitempty"`
	// Spec on OpCreate.
	Spec *RunSpec `json:"spec,omitempty"`
	// Runner, on OpCreate, is the replica that created the run: it holds
	// the run from its first record, so that no other replica claims it
	// between the creation and the creator's first heartbeat.
	Runner string `json:"runner,omitempty"`
	// State on OpEnd: RunCompleted or RunStopped.
	State RunState `json:"state,omitempty"`
	// Paused on OpHeartbeat: the runner waits for the app, Why says for
	// what.
	Paused bool `json:"paused,omitempty"`
}

// Encode writes r as JSON, checked as DecodeRunRecord checks it.
func (r *RunRecord) Encode() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// DecodeRunRecord reads one run record, strictly.
func DecodeRunRecord(b []byte) (RunRecord, error) {
	var r RunRecord
	if len(b) > maxRecordLen {
		return r, fmt.Errorf("%w: %d bytes", ErrBadRecord, len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return RunRecord{}, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	if dec.More() {
		return RunRecord{}, fmt.Errorf("%w: data after the record", ErrBadRecord)
	}
	if err := r.check(); err != nil {
		return RunRecord{}, err
	}
	return r, nil
}

func (r *RunRecord) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadRecord}, a...)...)
	}
	if r.Version != RecordVersion || r.Kind != KindRun {
		return bad("version %d kind %.64q", r.Version, r.Kind)
	}
	if r.Run == "" || len(r.Run) > maxReplayIDLen {
		return bad("run id of %d bytes", len(r.Run))
	}
	if r.Who == "" || len(r.Who) > MaxWhoLen || r.At.IsZero() || len(r.Why) > MaxWhyLen || len(r.Nonce) > 64 {
		return bad("who, when, why or nonce")
	}
	switch r.Op {
	case OpCreate:
		if r.Spec == nil {
			return bad("create without a spec")
		}
		if err := r.Spec.check(); err != nil {
			return bad("%v", err)
		}
	case OpEnd:
		if r.State != RunCompleted && r.State != RunStopped {
			return bad("end in state %.64q", r.State)
		}
	case OpHeartbeat, OpCancel, OpPause, OpResume:
	default:
		return bad("op %.64q", r.Op)
	}
	if r.Op != OpCreate && (r.Spec != nil || r.Runner != "") {
		return bad("a spec or a runner on %s", r.Op)
	}
	if len(r.Runner) > MaxWhoLen {
		return bad("runner of %d bytes", len(r.Runner))
	}
	if r.Op != OpEnd && r.State != "" {
		return bad("a state on %s", r.Op)
	}
	if r.Op != OpHeartbeat && r.Paused {
		return bad("paused on %s", r.Op)
	}
	return nil
}

func (s *RunSpec) check() error {
	if len(s.IDs) == 0 || len(s.IDs) > MaxReplaySelection {
		return fmt.Errorf("%d ids selected", len(s.IDs))
	}
	for _, id := range s.IDs {
		if _, err := ParseID(id); err != nil {
			return err
		}
	}
	if !(s.Rate > 0) || s.BatchSize < 1 || s.Sample < 0 || s.SampleTimeout < 0 ||
		!(s.StopFailureRatio > 0 && s.StopFailureRatio <= 1) || s.HeartbeatTTL <= 0 {
		return fmt.Errorf("rate %v, batch %d, sample %d in %v, stop ratio %v, heartbeat TTL %v",
			s.Rate, s.BatchSize, s.Sample, s.SampleTimeout, s.StopFailureRatio, s.HeartbeatTTL)
	}
	return nil
}

// The runs bucket: replay id → Run as JSON.
var bucketRuns = []byte("runs")

// applyRun applies one run record in the ledger's order, and reports
// whether it was accepted. Every reader applies the same rules to the same
// order, so every replica sees the same runner and the same end.
func applyRun(tx *bolt.Tx, source string, r *RunRecord) (bool, error) {
	b := tx.Bucket(bucketRuns)
	var run Run
	v := b.Get([]byte(r.Run))
	if v != nil {
		if err := json.Unmarshal(v, &run); err != nil {
			return false, fmt.Errorf("dead-letter index run %s: %w", r.Run, err)
		}
	}
	switch r.Op {
	case OpCreate:
		if v != nil {
			return false, nil // a replay id names one run
		}
		run = Run{ID: r.Run, Source: source, State: RunRunning, CreatedBy: r.Who, CreatedAt: r.At.UTC(), Why: r.Why, Spec: *r.Spec}
		if r.Runner != "" {
			run.Runner, run.HeartbeatAt = r.Runner, r.At.UTC()
		}
	case OpHeartbeat:
		if v == nil || run.Ended() {
			return false, nil
		}
		// The runner goes on; another replica takes over a run whose
		// runner went quiet for longer than the TTL the run was made with.
		if run.Runner != "" && run.Runner != r.Who && r.At.Sub(run.HeartbeatAt) <= run.Spec.HeartbeatTTL {
			return false, nil
		}
		run.Runner, run.HeartbeatAt, run.Paused, run.Detail = r.Who, r.At.UTC(), r.Paused, r.Why
		if run.Held {
			// An operator's pause outlasts what a heartbeat says of the app.
			run.Paused, run.Detail = true, run.HeldWhy
		}
	case OpEnd:
		if v == nil || run.Ended() || run.Runner != r.Who {
			return false, nil
		}
		run.State, run.Detail, run.EndedAt, run.Paused = r.State, r.Why, r.At.UTC(), false
		run.Held, run.HeldWhy = false, ""
	case OpCancel:
		if v == nil || run.Ended() {
			return false, nil
		}
		run.State, run.EndedAt, run.Paused = RunCancelled, r.At.UTC(), false
		run.Held, run.HeldWhy = false, ""
		run.Detail = byWhom("cancelled", r)
	case OpPause:
		if v == nil || run.Ended() || run.Held {
			return false, nil
		}
		run.Held, run.HeldWhy = true, byWhom("paused", r)
		run.Paused, run.Detail = true, run.HeldWhy
	case OpResume:
		if v == nil || run.Ended() || !run.Held {
			return false, nil
		}
		run.Held, run.HeldWhy = false, ""
		run.Paused, run.Detail = false, ""
	}
	out, err := json.Marshal(&run)
	if err != nil {
		return false, err
	}
	return true, b.Put([]byte(r.Run), out)
}

// byWhom says what an operator's record did, who and why: "paused by
// ops/ann: the app is being fixed".
func byWhom(what string, r *RunRecord) string {
	s := what + " by " + r.Who
	if r.Why != "" {
		s += ": " + r.Why
	}
	return s
}

// Run returns a run as the index holds it, with its progress.
func (x *Index) Run(id string) (Run, error) {
	var run Run
	err := x.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRuns).Get([]byte(id))
		if v == nil {
			return fmt.Errorf("%w: %q", ErrNoRun, id)
		}
		if err := json.Unmarshal(v, &run); err != nil {
			return fmt.Errorf("dead-letter index run %s: %w", id, err)
		}
		return progress(tx, &run)
	})
	return run, err
}

// runOnly returns a run as the index holds it, without its progress: for
// a runner's checks between two publishes, which must stay cheap.
func (x *Index) runOnly(id string) (Run, error) {
	var run Run
	err := x.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRuns).Get([]byte(id))
		if v == nil {
			return fmt.Errorf("%w: %q", ErrNoRun, id)
		}
		return json.Unmarshal(v, &run)
	})
	return run, err
}

// Runs returns the runs of source (every source when empty), newest first.
func (x *Index) Runs(source string) ([]Run, error) {
	var runs []Run
	err := x.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRuns).ForEach(func(_, v []byte) error {
			var run Run
			if err := json.Unmarshal(v, &run); err != nil {
				return err
			}
			if source != "" && run.Source != source {
				return nil
			}
			if err := progress(tx, &run); err != nil {
				return err
			}
			runs = append(runs, run)
			return nil
		})
	})
	slices.SortFunc(runs, func(a, b Run) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return runs, err
}

// progress counts run's letters by where the run left each. It reads
// every selected letter: a run names at most MaxReplaySelection.
func progress(tx *bolt.Tx, run *Run) error {
	p := Progress{Selected: len(run.Spec.IDs)}
	var ats []time.Time // when each Replay record was written
	for _, s := range run.Spec.IDs {
		id, err := ParseID(s)
		if err != nil {
			return err
		}
		l, ok, err := getLetter(tx, id)
		if err != nil {
			return err
		}
		switch st := runStep(&l, run.ID); {
		case st.published:
			p.Published++
			if st.handled {
				p.Handled++
			}
			if st.failed {
				p.Failed++
			}
			if !st.at.IsZero() {
				ats = append(ats, st.at)
			}
		case ok && run.replayable(&l):
			p.Remaining++
		default:
			p.Skipped++
		}
	}
	p.Rate, p.Waited = publishPace(ats, run.Spec.Rate)
	if p.Remaining > 0 && !run.Ended() {
		p.ETA = time.Duration(float64(p.Remaining) / run.Spec.Rate * float64(time.Second))
	}
	run.Progress = p
	return nil
}

// publishPace is the publish rate over the latest RateWindow of the
// publishes at ats, and the time spent between publishes not publishing: a
// gap longer than a second, or than four of the run's slots, is a wait (the
// sample's, a pause, a takeover), not the rate's pace.
func publishPace(ats []time.Time, rate float64) (float64, time.Duration) {
	if len(ats) < 2 {
		return 0, 0
	}
	slices.SortFunc(ats, func(a, b time.Time) int { return a.Compare(b) })
	long := time.Second
	if rate > 0 {
		long = max(long, time.Duration(4/rate*float64(time.Second)))
	}
	var waited time.Duration
	for i := 1; i < len(ats); i++ {
		if gap := ats[i].Sub(ats[i-1]); gap > long {
			waited += gap
		}
	}
	last := ats[len(ats)-1]
	from := len(ats) - 1
	for from > 0 && last.Sub(ats[from-1]) <= RateWindow {
		from--
	}
	// Within the window, the waits are left out too: a pause in the
	// middle of it is no slower pace.
	var span time.Duration
	slots := 0
	for i := from + 1; i < len(ats); i++ {
		if gap := ats[i].Sub(ats[i-1]); gap <= long {
			span += gap
			slots++
		}
	}
	if span <= 0 {
		return 0, waited
	}
	return float64(slots) / span.Seconds(), waited
}

// step is where a run left one letter.
type step struct {
	published, handled, failed bool
	// at is when its Replay record was written.
	at time.Time
}

// runStep reads a letter's history for run's records. An outcome counts as
// published: the outcome's record can reach the ledger before the Replay
// record (see Decide).
func runStep(l *Letter, run string) step {
	var s step
	for i := range l.History {
		r := &l.History[i]
		if r.ReplayID != run {
			continue
		}
		switch r.Transition {
		case Replay:
			s.published, s.at = true, r.At
		case Complete:
			s.published, s.handled = true, true
		case FailReplay:
			s.published, s.failed = true, true
		}
	}
	return s
}

// replayable reports whether the run may publish l now: approved, or
// pending when the run was forced.
func (r *Run) replayable(l *Letter) bool {
	return l.Seen && (l.State == Approved || (r.Spec.Force && l.State == Pending))
}
