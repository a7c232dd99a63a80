package admin

import (
	"maps"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/deadletter"
)

// letterProto is a dead letter as the API shows it; show adds what only
// one letter's answer carries (its history and approved repair), and the
// caller adds the body and the timeline.
func letterProto(l *deadletter.Letter, show bool) *adminv1.DeadLetter {
	out := &adminv1.DeadLetter{
		Id:             l.ID.String(),
		Source:         l.Source,
		State:          string(l.State),
		EventId:        l.EventID,
		Reason:         l.Reason,
		Error:          l.Error,
		ErrorClass:     l.ErrorClass,
		Attempts:       int32(l.Attempts),
		Origin:         l.Origin,
		ReplayId:       l.ReplayID,
		ReplayOf:       l.ReplayOf,
		Successor:      l.Successor,
		FirstFailureAt: timestamp(l.FirstFailureAt),
		DeadLetteredAt: timestamp(l.DeadLetteredAt),
		ContentType:    l.ContentType,
		Key:            l.Key,
		BodySize:       int64(l.BodySize),
		Headers:        maps.Clone(l.Headers),
	}
	if !show {
		return out
	}
	if a := l.Approval(); a != nil {
		out.Repair = repairProto(a.Repair)
	}
	for i := range l.History {
		out.History = append(out.History, recordProto(&l.History[i]))
	}
	return out
}

func recordProto(r *deadletter.Record) *adminv1.LedgerRecord {
	return &adminv1.LedgerRecord{
		Transition: string(r.Transition),
		State:      string(r.State),
		Who:        r.Who,
		At:         timestamp(r.At),
		Why:        r.Why,
		ReplayId:   r.ReplayID,
		Successor:  r.Successor,
		Repair:     repairProto(r.Repair),
	}
}

func repairProto(r *deadletter.Repair) *adminv1.Repair {
	if r == nil {
		return nil
	}
	return &adminv1.Repair{Body: r.Body, ContentType: r.ContentType, Note: r.Note}
}

// countsProto is a source's counts; now dates the oldest open one.
func countsProto(source string, c deadletter.Counts, now time.Time) *adminv1.DeadLetterCounts {
	out := &adminv1.DeadLetterCounts{Source: source, Open: int64(c.Open), ByState: map[string]int64{}}
	for s, n := range c.ByState {
		if n > 0 {
			out.ByState[string(s)] = int64(n)
		}
	}
	if !c.OldestOpen.IsZero() && c.Open > 0 {
		out.OldestOpenAt = timestamppb.New(c.OldestOpen)
		out.OldestOpenAge = durationpb.New(max(now.Sub(c.OldestOpen), 0))
	}
	return out
}

// states reads a request's states.
func states(in []string) ([]deadletter.State, error) {
	var out []deadletter.State
	for _, s := range in {
		st := deadletter.State(s)
		if !st.Valid() {
			return nil, grpcstatus.Errorf(codes.InvalidArgument, "states: %q is not a state (want one of %v)", s, deadletter.States)
		}
		out = append(out, st)
	}
	return out, nil
}

// timeRange reads a request's since and until; either may be unset.
func timeRange(since, until *timestamppb.Timestamp) (time.Time, time.Time, error) {
	var from, to time.Time
	if since != nil {
		if err := since.CheckValid(); err != nil {
			return from, to, grpcstatus.Errorf(codes.InvalidArgument, "since: %v", err)
		}
		from = since.AsTime()
	}
	if until != nil {
		if err := until.CheckValid(); err != nil {
			return from, to, grpcstatus.Errorf(codes.InvalidArgument, "until: %v", err)
		}
		to = until.AsTime()
	}
	if !from.IsZero() && !to.IsZero() && !from.Before(to) {
		return from, to, grpcstatus.Error(codes.InvalidArgument, "since must be before until")
	}
	return from, to, nil
}

// timestamp is t, or nil when t is zero.
func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// runProto is a replay run as the API shows it; withIDs adds the selected
// ids, which only the answer about one run carries.
func runProto(r *deadletter.Run, withIDs bool) *adminv1.Replay {
	p := r.Progress
	out := &adminv1.Replay{
		Id:               r.ID,
		Source:           r.Source,
		State:            string(r.State),
		Detail:           r.Detail,
		Paused:           r.Paused,
		Held:             r.Held,
		Runner:           r.Runner,
		HeartbeatAt:      timestamp(r.HeartbeatAt),
		CreatedBy:        r.CreatedBy,
		CreatedAt:        timestamp(r.CreatedAt),
		EndedAt:          timestamp(r.EndedAt),
		Why:              r.Why,
		RatePerSecond:    r.Spec.Rate,
		BatchSize:        int32(r.Spec.BatchSize),
		Sample:           int32(r.Spec.Sample),
		StopFailureRatio: r.Spec.StopFailureRatio,
		Force:            r.Spec.Force,
		DryRun:           r.DryRun,
		Progress: &adminv1.Progress{
			Selected:  int64(p.Selected),
			Published: int64(p.Published),
			Handled:   int64(p.Handled),
			Failed:    int64(p.Failed),
			Remaining: int64(p.Remaining),
			Skipped:   int64(p.Skipped),
			Rate:      p.Rate,
		},
	}
	if p.ETA > 0 {
		out.Progress.Eta = durationpb.New(p.ETA)
	}
	if p.Waited > 0 {
		out.Progress.Waited = durationpb.New(p.Waited)
	}
	if withIDs || r.DryRun {
		out.Ids = append([]string(nil), r.Spec.IDs...)
	}
	return out
}
