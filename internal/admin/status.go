package admin

import (
	"context"
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/redact"
)

// waitingTimeout bounds how long GetStatus waits for a broker to say how
// many copies wait in a source's retry tiers.
const waitingTimeout = 2 * time.Second

// reading is everything a status is made of, read at one moment.
type reading struct {
	now      time.Time
	started  time.Time
	notReady error
	engine   dispatch.Status
	sources  []sourceReading
	journal  journal.Stats
	// journalErr is why the journal could not be read.
	journalErr error
}

// sourceReading is one source's part of a reading.
type sourceReading struct {
	src Source
	// notConnected is why the broker is not usable; nil when it is.
	notConnected error
	// waiting is the copies in each tier, in Tiers order; nil when the
	// broker cannot say.
	waiting []int64
	// deadLetters are its dead letters' counts; nil when unknown.
	deadLetters *adminv1.DeadLetterCounts
}

// read takes a reading of the sidecar.
func (s *service) read(ctx context.Context) reading {
	r := reading{now: s.o.Now(), started: s.o.Started, engine: s.o.Engine.Status()}
	if s.o.NotReady != nil {
		r.notReady = s.o.NotReady()
	}
	r.journal, r.journalErr = s.o.Journal.Stats()
	for _, src := range s.o.Sources {
		sr := sourceReading{src: src}
		if src.Ready != nil {
			sr.notConnected = src.Ready()
		}
		if src.Waiting != nil && sr.notConnected == nil {
			wctx, cancel := context.WithTimeout(ctx, waitingTimeout)
			w, err := src.Waiting(wctx)
			cancel()
			if err == nil && len(w) == len(src.Tiers) {
				sr.waiting = w
			} else if err != nil {
				s.log.Debug("admin: retry tiers' depth unknown", "source", src.Name, "err", redact.Error(err))
			}
		}
		if s.o.DeadLetters != nil {
			if c, err := s.o.DeadLetters.Counts(src.Name); err == nil {
				sr.deadLetters = countsProto(src.Name, c, r.now)
			} else {
				s.log.Debug("admin: dead-letter counts unknown", "source", src.Name, "err", err)
			}
		}
		r.sources = append(r.sources, sr)
	}
	return r
}

// statusOf makes the answer of GetStatus from a reading.
func statusOf(r reading) *adminv1.Status {
	e := r.engine
	out := &adminv1.Status{
		Calls: &adminv1.Calls{
			InFlight:          int32(e.InFlight),
			Limit:             int32(e.Limit),
			Max:               int32(e.Max),
			Queued:            int32(e.Queued),
			FreshIntakePaused: e.FreshIntakePaused,
			AppUnreachable:    e.AppUnreachable,
		},
		Budget: &adminv1.Budget{},
		Journal: &adminv1.Journal{
			Path:      r.journal.Path,
			SizeBytes: r.journal.Size,
			Open:      r.journal.Open,
			CommitP50: durationpb.New(r.journal.Commits.P50),
			CommitMax: durationpb.New(r.journal.Commits.Max),
		},
	}
	if !r.started.IsZero() {
		out.StartedAt = timestamppb.New(r.started)
	}
	if r.notReady != nil {
		out.NotReady = redact.Text(r.notReady.Error())
	}
	if !e.OverloadUntil.IsZero() {
		out.Calls.OverloadUntil = timestamppb.New(e.OverloadUntil)
	}
	if e.Budget != nil {
		out.Budget.Tokens = e.Budget.Tokens
		out.Budget.Denied = e.Budget.Denied
	}
	routes := make(map[string]dispatch.RouteStatus, len(e.Routes))
	for _, rs := range e.Routes {
		routes[rs.Name] = rs
	}
	for _, sr := range r.sources {
		out.Sources = append(out.Sources, sourceStatus(r.now, e, routes[sr.src.Name], sr))
	}
	return out
}

// sourceStatus is one source's part of a status: whether it consumes, and
// if not, the first of the reasons that hold it back, in the order they
// would have to clear.
func sourceStatus(now time.Time, e dispatch.Status, rs dispatch.RouteStatus, sr sourceReading) *adminv1.SourceStatus {
	src := sr.src
	out := &adminv1.SourceStatus{
		Name:      src.Name,
		Broker:    src.Broker,
		From:      src.From,
		Connected: sr.notConnected == nil,
		State:     "consuming",
		InFlight:  int32(rs.InFlight),
		// What an operator watches of its dead letters: no message data.
		DeadLetters: sr.deadLetters,
	}
	if src.Backlog != nil {
		if e, ok := src.Backlog(); ok {
			b := &adminv1.Backlog{Messages: int64(e.Backlog), ArrivalRate: e.Arrival, CompletionRate: e.Completion,
				Converging: !math.IsInf(e.Drain, 1)}
			if b.Converging {
				b.Drain = durationpb.New(time.Duration(e.Drain * float64(time.Second)))
			}
			out.Backlog = b
		}
	}
	if !rs.Oldest.IsZero() {
		out.OldestUnsettledAge = durationpb.New(max(now.Sub(rs.Oldest), 0))
	}
	if src.Share != nil {
		g := src.Share()
		out.ShareGroup = &adminv1.ShareGroup{Name: g.Name, RetryGroup: g.RetryGroup, DeliveryCountLimit: int32(g.Limit),
			LockDuration: durationpb.New(g.Lock), ReadFrom: g.ReadFrom}
	}
	paused := func(reason string) {
		out.State, out.Reason = "paused", reason
	}
	switch {
	case sr.notConnected != nil:
		paused("not connected: " + redact.Text(sr.notConnected.Error()))
	case e.Paused() != "":
		paused(e.Paused())
	case rs.RetriesHeld && len(src.Tiers) > 0:
		out.Reason = "retries held: the retry budget is spent; fresh messages go on"
	}
	for i, t := range src.Tiers {
		tier := &adminv1.RetryTier{Name: t.Name, Delay: durationpb.New(t.Delay)}
		if sr.waiting != nil {
			tier.Waiting, tier.Known = sr.waiting[i], true
		}
		out.RetryTiers = append(out.RetryTiers, tier)
	}
	return out
}
