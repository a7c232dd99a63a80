package dispatch

import (
	"sync"
	"time"

	"handoff.dev/handoff/internal/budget"
)

// Status is a reading of the engine, for operators: what holds its intake
// and its calls back, and what it has in flight.
type Status struct {
	// InFlight is the calls to the app in flight; Limit the adaptive bound
	// on them now, Max its ceiling; Queued the hand-offs waiting for a slot.
	InFlight, Limit, Max, Queued int
	// FreshIntakePaused: the retry budget is spent and first attempts keep
	// failing, so fresh messages wait (retries and probes go on).
	FreshIntakePaused bool
	// AppUnreachable: the app refuses connections; intake and calls wait.
	AppUnreachable bool
	// JournalFull: the journal cannot be written (no room); intake waits.
	JournalFull bool
	// OverloadUntil is when the app's last Retry-After ends, when it is
	// still ahead; zero otherwise.
	OverloadUntil time.Time
	// Budget is the retry budget's reading; nil when re-attempts are not
	// limited.
	Budget *budget.BudgetState
	Routes []RouteStatus
}

// Paused says why fresh intake waits now, "" when nothing holds it: the one
// answer the status, the intake gauge and a replay's pressure all give.
// The first reason that holds is given.
func (st Status) Paused() string {
	switch {
	case st.AppUnreachable:
		return "app unreachable: intake waits until it accepts connections again"
	case st.JournalFull:
		return "journal full: intake waits until the journal has room to record hand-offs"
	case !st.OverloadUntil.IsZero():
		return "the app asked to slow down (Retry-After): every call waits until " + st.OverloadUntil.UTC().Format(time.RFC3339)
	case st.FreshIntakePaused:
		return "fresh intake paused: the retry budget is spent and first attempts keep failing; retries and probes go on"
	}
	return ""
}

// RouteStatus is what the engine has of one route.
type RouteStatus struct {
	Name string
	// InFlight is the deliveries taken and not yet settled or handed back;
	// Oldest when the first of them was taken (zero when none).
	InFlight int
	Oldest   time.Time
	// RetriesHeld: the retry budget is spent, so the route's retries wait
	// for tokens (RabbitMQ's retry consumer) or are not fetched (Kafka's
	// retry topics).
	RetriesHeld bool
}

// Status reads the engine. It is safe for concurrent use, also before Run
// and after it returns.
func (e *Engine) Status() Status {
	st := Status{
		InFlight:          e.limiter.InFlight(),
		Limit:             e.limiter.Limit(),
		Max:               max(e.o.MaxConcurrency, 1),
		Queued:            e.limiter.Queued(),
		FreshIntakePaused: e.intakes.Paused(),
		AppUnreachable:    e.gate.isHeld(),
		JournalFull:       e.jgate.isHeld(),
	}
	if until := time.Unix(0, e.overloadUntil.Load()); e.overloadUntil.Load() != 0 && until.After(e.now()) {
		st.OverloadUntil = until
	}
	exhausted := false
	if b := e.o.Budget; b != nil {
		bs := b.State()
		st.Budget = &bs
		exhausted = bs.Tokens < 1
	}
	for i := range e.o.Routes {
		r := &e.o.Routes[i]
		rs := RouteStatus{Name: r.Name, RetriesHeld: exhausted}
		if o := e.open[r.Name]; o != nil {
			rs.InFlight, rs.Oldest = o.reading()
		}
		st.Routes = append(st.Routes, rs)
	}
	return st
}

// openSet is the deliveries of one route taken and not yet done with, each
// with the time it was taken. It is safe for concurrent use.
type openSet struct {
	mu   sync.Mutex
	next uint64
	at   map[uint64]time.Time
}

func newOpenSet() *openSet { return &openSet{at: map[uint64]time.Time{}} }

// enter records a delivery taken at t; leave with the id it returns forgets
// it.
func (o *openSet) enter(t time.Time) (id uint64) {
	o.mu.Lock()
	id = o.next
	o.next++
	o.at[id] = t
	o.mu.Unlock()
	return id
}

func (o *openSet) leave(id uint64) {
	o.mu.Lock()
	delete(o.at, id)
	o.mu.Unlock()
}

// reading is how many deliveries are open and when the oldest was taken.
// It walks them all: it is for operators, not the hot path.
func (o *openSet) reading() (n int, oldest time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, t := range o.at {
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	return len(o.at), oldest
}
