// Package admintest holds an in-memory admin.DeadLetters, for tests of the
// admin API and of the CLI over it that need no broker. It does not import
// package admin, so that admin's own tests can use it; they assert that it
// implements the interface.
package admintest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/deadletter"
)

// DeadLetters keeps dead letters and replay runs in memory. Transitions
// follow deadletter.Decide. A running replay publishes PerPoll more of its
// selection each time it is read, so that a client polling it sees it
// move and end without a clock. It is safe for concurrent use.
type DeadLetters struct {
	// PerPoll is how many a running replay publishes per read; 1 when 0.
	PerPoll int

	mu       sync.Mutex
	now      func() time.Time
	sources  []string
	letters  map[deadletter.ID]*deadletter.Letter
	bodies   map[deadletter.ID][]byte
	failures map[deadletter.ID]error
	changes  []deadletter.Change
	requests []deadletter.ReplayRequest
	runs     []*deadletter.Run
}

// New returns dead letters of the named sources; now dates the ledger
// records (time.Now when nil).
func New(now func() time.Time, sources ...string) *DeadLetters {
	if now == nil {
		now = time.Now
	}
	return &DeadLetters{now: now, sources: sources, letters: map[deadletter.ID]*deadletter.Letter{},
		bodies: map[deadletter.ID][]byte{}, failures: map[deadletter.ID]error{}}
}

// Add adds a letter (Seen, Pending unless its State says otherwise) and,
// unless body is nil, its DLQ entry's body; a letter without one answers
// Message as one retention removed.
func (d *DeadLetters) Add(l deadletter.Letter, body []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l.State == "" {
		l.State = deadletter.Pending
	}
	l.Seen = true
	if body != nil {
		l.BodySize = len(body)
		d.bodies[l.ID] = body
	}
	d.letters[l.ID] = &l
}

// FailApply makes every change of id fail with err.
func (d *DeadLetters) FailApply(id deadletter.ID, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failures[id] = err
}

// Changes returns the changes applied, in order.
func (d *DeadLetters) Changes() []deadletter.Change {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.changes)
}

// Requests returns the replay requests received, dry runs included.
func (d *DeadLetters) Requests() []deadletter.ReplayRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.requests)
}

// SourceNames implements admin.DeadLetters.
func (d *DeadLetters) SourceNames() []string { return slices.Clone(d.sources) }

func (d *DeadLetters) source(name string) error {
	if !slices.Contains(d.sources, name) {
		return fmt.Errorf("%w: %q", deadletter.ErrNoSource, name)
	}
	return nil
}

// sorted is every letter in DLQ position order.
func (d *DeadLetters) sorted() []*deadletter.Letter {
	out := make([]*deadletter.Letter, 0, len(d.letters))
	for _, l := range d.letters {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b *deadletter.Letter) int { return compareID(a.ID, b.ID) })
	return out
}

func compareID(a, b deadletter.ID) int {
	return cmp.Or(cmp.Compare(a.Log, b.Log), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
}

func match(f *deadletter.Filter, l *deadletter.Letter) bool {
	switch {
	case f.Source != "" && l.Source != f.Source, f.Reason != "" && l.Reason != f.Reason,
		f.EventID != "" && l.EventID != f.EventID:
		return false
	case !f.Since.IsZero() && l.DeadLetteredAt.Before(f.Since), !f.Until.IsZero() && !l.DeadLetteredAt.Before(f.Until):
		return false
	}
	return len(f.States) == 0 || slices.Contains(f.States, l.State)
}

// List implements admin.DeadLetters.
func (d *DeadLetters) List(f deadletter.Filter) (deadletter.Page, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	limit := f.Limit
	if limit <= 0 {
		limit = deadletter.DefaultLimit
	}
	var after *deadletter.ID
	if f.After != "" {
		id, err := deadletter.ParseID(f.After)
		if err != nil {
			return deadletter.Page{}, fmt.Errorf("page token: %w", err)
		}
		after = &id
	}
	var p deadletter.Page
	for _, l := range d.sorted() {
		if (after != nil && compareID(l.ID, *after) <= 0) || !match(&f, l) {
			continue
		}
		if len(p.Letters) == limit {
			p.Next = p.Letters[len(p.Letters)-1].ID.String()
			break
		}
		p.Letters = append(p.Letters, clone(l))
	}
	return p, nil
}

func clone(l *deadletter.Letter) deadletter.Letter {
	c := *l
	c.History = slices.Clone(l.History)
	return c
}

// Counts implements admin.DeadLetters.
func (d *DeadLetters) Counts(source string) (deadletter.Counts, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.source(source); err != nil {
		return deadletter.Counts{}, err
	}
	c := deadletter.Counts{ByState: map[deadletter.State]int{}}
	for _, l := range d.letters {
		if l.Source != source {
			continue
		}
		c.ByState[l.State]++
		if l.Open() {
			c.Open++
			if c.OldestOpen.IsZero() || l.DeadLetteredAt.Before(c.OldestOpen) {
				c.OldestOpen = l.DeadLetteredAt
			}
		}
	}
	return c, nil
}

// Get implements admin.DeadLetters.
func (d *DeadLetters) Get(id deadletter.ID) (deadletter.Letter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.letters[id]
	if !ok {
		return deadletter.Letter{}, fmt.Errorf("%w: %s", deadletter.ErrNotFound, id)
	}
	return clone(l), nil
}

// Message implements admin.DeadLetters.
func (d *DeadLetters) Message(_ context.Context, id deadletter.ID) (*broker.Message, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.letters[id]
	body, has := d.bodies[id]
	if !ok || !has {
		return nil, fmt.Errorf("%w: %s is not in the log", deadletter.ErrNotFound, id)
	}
	return &broker.Message{Body: slices.Clone(body), ContentType: l.ContentType, Key: l.Key, Headers: l.Headers}, nil
}

// Apply implements admin.DeadLetters.
func (d *DeadLetters) Apply(_ context.Context, c deadletter.Change) (deadletter.Letter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.letters[c.ID]
	if !ok {
		return deadletter.Letter{}, fmt.Errorf("%w: %s", deadletter.ErrNotFound, c.ID)
	}
	if err := d.failures[c.ID]; err != nil {
		return clone(l), err
	}
	to, err := deadletter.Decide(l.State, c.Transition)
	if err != nil {
		return clone(l), err
	}
	d.changes = append(d.changes, c)
	l.State = to
	l.History = append(l.History, deadletter.Record{Version: deadletter.RecordVersion, Kind: deadletter.KindTransition,
		ID: c.ID.String(), Transition: c.Transition, State: to, Who: c.Who, At: d.now().UTC(), Why: c.Why, Repair: c.Repair})
	return clone(l), nil
}

// CreateReplay implements admin.DeadLetters: it resolves the selection,
// refuses what the Manager refuses (ids of two sources, one neither
// approved nor forced), applies the Manager's defaults and, unless a dry run, keeps a
// running run with the id "r<n>". A selection by state takes any state.
func (d *DeadLetters) CreateReplay(_ context.Context, r deadletter.ReplayRequest) (deadletter.Run, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.requests = append(d.requests, r)
	var ids []string
	source := r.Filter.Source
	if len(r.IDs) > 0 {
		for _, id := range r.IDs {
			l, ok := d.letters[id]
			switch {
			case !ok:
				return deadletter.Run{}, fmt.Errorf("%w: %s", deadletter.ErrNotFound, id)
			case source != "" && l.Source != source:
				return deadletter.Run{}, fmt.Errorf("%w: %s and %s are dead letters of different sources", deadletter.ErrBadRequest, r.IDs[0], id)
			case l.State == deadletter.Pending && !r.Force:
				return deadletter.Run{}, fmt.Errorf("%w: %s is pending: approve it first, or force the replay", deadletter.ErrIllegal, id)
			case l.State != deadletter.Pending && l.State != deadletter.Approved:
				return deadletter.Run{}, fmt.Errorf("%w: %s is %s: only approved dead letters are replayed", deadletter.ErrIllegal, id, l.State)
			}
			source = l.Source
			ids = append(ids, id.String())
		}
	} else {
		if err := d.source(source); err != nil {
			return deadletter.Run{}, err
		}
		f := r.Filter
		if len(f.States) == 0 {
			f.States = []deadletter.State{deadletter.Approved}
		}
		for _, l := range d.sorted() {
			if match(&f, l) {
				ids = append(ids, l.ID.String())
			}
		}
	}
	spec := deadletter.RunSpec{IDs: ids, Force: r.Force, Rate: r.Rate, BatchSize: r.BatchSize, Sample: r.Sample,
		SampleTimeout: r.SampleTimeout, StopFailureRatio: r.StopFailureRatio, HeartbeatTTL: deadletter.DefaultHeartbeatTTL}
	if spec.Rate == 0 {
		spec.Rate = deadletter.DefaultReplayRate
	}
	if spec.BatchSize == 0 {
		spec.BatchSize = deadletter.DefaultReplayBatch
	}
	if spec.StopFailureRatio == 0 {
		spec.StopFailureRatio = deadletter.DefaultStopFailureRatio
	}
	if spec.Sample > 0 && spec.SampleTimeout == 0 {
		spec.SampleTimeout = deadletter.DefaultSampleTimeout
	}
	run := deadletter.Run{ID: fmt.Sprintf("r%d", len(d.runs)+1), Source: source, State: deadletter.RunRunning,
		CreatedBy: r.Who, CreatedAt: d.now().UTC(), Why: r.Why, Spec: spec, DryRun: r.DryRun, Runner: "replica-1",
		Progress: deadletter.Progress{Selected: len(ids), Remaining: len(ids)}}
	if r.DryRun {
		run.ID = ""
		return run, nil
	}
	d.runs = append(d.runs, &run)
	return cloneRun(&run), nil
}

func cloneRun(r *deadletter.Run) deadletter.Run {
	c := *r
	c.Spec.IDs = slices.Clone(r.Spec.IDs)
	return c
}

func (d *DeadLetters) run(id string) (*deadletter.Run, error) {
	for _, r := range d.runs {
		if r.ID == id {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: %q", deadletter.ErrNoRun, id)
}

// Replay implements admin.DeadLetters; see PerPoll.
func (d *DeadLetters) Replay(id string) (deadletter.Run, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, err := d.run(id)
	if err != nil {
		return deadletter.Run{}, err
	}
	if !r.Ended() {
		p := &r.Progress
		n := min(max(d.PerPoll, 1), p.Remaining)
		p.Published += n
		p.Handled += n
		p.Remaining -= n
		p.Rate = r.Spec.Rate
		p.ETA = time.Duration(float64(p.Remaining) / r.Spec.Rate * float64(time.Second))
		r.HeartbeatAt = d.now().UTC()
		if p.Remaining == 0 {
			r.State, r.EndedAt, r.Detail = deadletter.RunCompleted, d.now().UTC(), "every selected dead letter was published"
		}
	}
	return cloneRun(r), nil
}

// Replays implements admin.DeadLetters: newest first.
func (d *DeadLetters) Replays(source string) ([]deadletter.Run, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []deadletter.Run
	for i := len(d.runs) - 1; i >= 0; i-- {
		if source == "" || d.runs[i].Source == source {
			out = append(out, cloneRun(d.runs[i]))
		}
	}
	return out, nil
}

// CancelReplay implements admin.DeadLetters.
func (d *DeadLetters) CancelReplay(_ context.Context, id, who, why string) (deadletter.Run, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, err := d.run(id)
	if err != nil {
		return deadletter.Run{}, err
	}
	if r.Ended() {
		return cloneRun(r), fmt.Errorf("%w: replay %s is %s", deadletter.ErrIllegal, id, r.State)
	}
	r.State, r.EndedAt, r.Detail = deadletter.RunCancelled, d.now().UTC(), fmt.Sprintf("cancelled by %s: %s", who, why)
	return cloneRun(r), nil
}

// PauseReplay implements admin.DeadLetters.
func (d *DeadLetters) PauseReplay(_ context.Context, id, who, why string) (deadletter.Run, error) {
	return d.hold(id, true, "paused by "+who+": "+why)
}

// ResumeReplay implements admin.DeadLetters.
func (d *DeadLetters) ResumeReplay(_ context.Context, id, who, why string) (deadletter.Run, error) {
	return d.hold(id, false, "")
}

func (d *DeadLetters) hold(id string, held bool, detail string) (deadletter.Run, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, err := d.run(id)
	if err != nil {
		return deadletter.Run{}, err
	}
	if r.Ended() || r.Held == held {
		return cloneRun(r), fmt.Errorf("%w: replay %s is %s (held %t)", deadletter.ErrIllegal, id, r.State, r.Held)
	}
	r.Held, r.HeldWhy, r.Paused, r.Detail = held, detail, held, detail
	return cloneRun(r), nil
}
