package deadletter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"handoff.dev/handoff/internal/broker"
)

// Republisher publishes a replayed copy to a source's own queue or topic
// and returns once the broker confirmed it. msg holds the original's key,
// headers, content type and the body to replay; trail is the handoff-*
// headers the copy carries (its event id, replay id and the dead letter it
// replays), which replace any handoff-* header of msg.
type Republisher interface {
	Republish(ctx context.Context, msg *broker.Message, trail broker.Headers) error
}

// ManagedSource is one source whose dead letters a Manager keeps.
type ManagedSource struct {
	Source
	Republisher Republisher
}

// ManagerOptions configures a Manager.
type ManagerOptions struct {
	Index   *Index
	Sources []ManagedSource
	// Replica names this sidecar in the ledger: as the runner of a replay,
	// and as who saw a replayed copy handled (the journal's instance id).
	Replica string
	// Pressure says why a replay must wait now (fresh intake paused, the
	// app answering overload or unreachable); "" when it may go on.
	Pressure func() string
	Logger   *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Poll is how often the index catches up with the logs, and runs are
	// looked after; DefaultPoll when 0.
	Poll time.Duration
	// HeartbeatTTL is how long a replay's runner may go without a heartbeat
	// before another replica takes the run over; DefaultHeartbeatTTL when 0.
	HeartbeatTTL time.Duration
}

// Defaults of ManagerOptions.
const (
	DefaultPoll         = time.Second
	DefaultHeartbeatTTL = 10 * time.Second
)

// Manager is the dead letters of every source of one sidecar: the index,
// its catch-up with the logs, the replay runs this replica holds, and the
// calls the admin API makes. It is safe for concurrent use.
type Manager struct {
	o   ManagerOptions
	log *slog.Logger
	now func() time.Time

	mu      sync.Mutex
	ctx     context.Context    // Run's, once it runs: runners live in it
	running map[string]*runner // replay id → the run this replica drives
}

// NewManager returns a manager; Run keeps it up to date.
func NewManager(o ManagerOptions) *Manager {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Poll <= 0 {
		o.Poll = DefaultPoll
	}
	if o.HeartbeatTTL <= 0 {
		o.HeartbeatTTL = DefaultHeartbeatTTL
	}
	if o.Pressure == nil {
		o.Pressure = func() string { return "" }
	}
	return &Manager{o: o, log: o.Logger, now: o.Now, running: map[string]*runner{}}
}

// ErrNoSource is returned for a source the manager does not keep.
var ErrNoSource = errors.New("no such source")

// source returns the managed source named name.
func (m *Manager) source(name string) (*ManagedSource, error) {
	for i := range m.o.Sources {
		if m.o.Sources[i].Name == name {
			return &m.o.Sources[i], nil
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrNoSource, name)
}

// sourceOf returns the managed source whose DLQ holds id.
func (m *Manager) sourceOf(id ID) (*ManagedSource, error) {
	for i := range m.o.Sources {
		if m.o.Sources[i].DLQ.Name() == id.Log {
			return &m.o.Sources[i], nil
		}
	}
	return nil, fmt.Errorf("%w: no source's dead letters are in %s", ErrNotFound, id.Log)
}

// SourceNames lists the managed sources, in configuration order.
func (m *Manager) SourceNames() []string {
	out := make([]string, len(m.o.Sources))
	for i, s := range m.o.Sources {
		out[i] = s.Name
	}
	return out
}

// List returns one page of the dead letters f selects, from the index.
func (m *Manager) List(f Filter) (Page, error) { return m.o.Index.List(f) }

// Counts returns a source's counts by state, its open count and its oldest
// open dead letter, from the index.
func (m *Manager) Counts(source string) (Counts, error) {
	if _, err := m.source(source); err != nil {
		return Counts{}, err
	}
	return m.o.Index.Counts(source)
}

// Get returns one dead letter, from the index.
func (m *Manager) Get(id ID) (Letter, error) { return m.o.Index.Get(id) }

// Message reads a dead letter's DLQ entry: its body, key and headers.
func (m *Manager) Message(ctx context.Context, id ID) (*broker.Message, error) {
	src, err := m.sourceOf(id)
	if err != nil {
		return nil, err
	}
	return Message(ctx, src.Source, id)
}

// Apply records an operator's change (Approve, Terminate) in the ledger of
// the source whose DLQ holds it.
func (m *Manager) Apply(ctx context.Context, c Change) (Letter, error) {
	src, err := m.sourceOf(c.ID)
	if err != nil {
		return Letter{}, err
	}
	switch c.Transition {
	case Approve, Terminate:
	default:
		return Letter{}, fmt.Errorf("%w: %s is recorded by the sidecar, not by hand", ErrIllegal, c.Transition)
	}
	return m.o.Index.Apply(ctx, src.Source, c)
}
