package admin

import (
	"context"
	"math"
	"slices"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/deadletter"
)

func (s *service) CreateReplay(ctx context.Context, req *adminv1.CreateReplayRequest) (*adminv1.Replay, error) {
	dl, err := s.deadLetters()
	if err != nil {
		return nil, err
	}
	who, err := s.who(req.GetOperator())
	if err != nil {
		return nil, err
	}
	r, err := replayRequest(req)
	if err != nil {
		return nil, err
	}
	r.Who = who
	run, err := dl.CreateReplay(ctx, r)
	if err != nil {
		return nil, s.fail("starting a replay", err)
	}
	return runProto(&run, true), nil
}

// replayRequest reads a CreateReplayRequest. A zero is left for the
// Manager to default (rate, batch size, stop ratio, the sample's timeout,
// the approved state), as the proto's comments say it does.
func replayRequest(req *adminv1.CreateReplayRequest) (deadletter.ReplayRequest, error) {
	bad := func(format string, a ...any) (deadletter.ReplayRequest, error) {
		return deadletter.ReplayRequest{}, grpcstatus.Errorf(codes.InvalidArgument, format, a...)
	}
	r := deadletter.ReplayRequest{
		Force:            req.GetForce(),
		Rate:             req.GetRatePerSecond(),
		BatchSize:        int(req.GetBatchSize()),
		Sample:           int(req.GetSample()),
		StopFailureRatio: req.GetStopFailureRatio(),
		DryRun:           req.GetDryRun(),
		Why:              req.GetWhy(),
	}
	selection := req.GetSource() != "" || req.GetReason() != "" || req.GetSince() != nil || req.GetUntil() != nil || len(req.GetStates()) > 0
	switch {
	case len(req.GetIds()) > 0 && selection:
		return bad("ids, or a selection by source, reason, time and state: not both")
	case len(req.GetIds()) == 0 && req.GetSource() == "":
		return bad("ids or a source is required")
	case len(req.GetIds()) > deadletter.MaxReplaySelection:
		return bad("ids: %d, at most %d in one replay", len(req.GetIds()), deadletter.MaxReplaySelection)
	}
	named := make(map[deadletter.ID]bool, len(req.GetIds()))
	for i, s := range req.GetIds() {
		id, err := deadletter.ParseID(s)
		if err != nil {
			return bad("ids[%d]: %v", i, err)
		}
		if named[id] {
			return bad("ids[%d]: %s is named twice", i, s)
		}
		named[id] = true
		r.IDs = append(r.IDs, id)
	}
	if len(r.IDs) == 0 {
		var err error
		r.Filter = deadletter.Filter{Source: req.GetSource(), Reason: req.GetReason()}
		if r.Filter.States, err = states(req.GetStates()); err != nil {
			return r, err
		}
		if r.Filter.Since, r.Filter.Until, err = timeRange(req.GetSince(), req.GetUntil()); err != nil {
			return r, err
		}
	}
	switch {
	case math.IsNaN(r.Rate) || math.IsInf(r.Rate, 0) || r.Rate < 0:
		return bad("rate_per_second: want a number above 0, or 0 for the default")
	case r.BatchSize < 0:
		return bad("batch_size: want 0 or more")
	case r.Sample < 0:
		return bad("sample: want 0 or more")
	case math.IsNaN(r.StopFailureRatio) || r.StopFailureRatio < 0 || r.StopFailureRatio > 1:
		return bad("stop_failure_ratio: want a share from 0 to 1")
	}
	if t := req.GetSampleTimeout(); t != nil {
		if err := t.CheckValid(); err != nil || t.AsDuration() < 0 {
			return bad("sample_timeout: want a duration of 0 or more")
		}
		r.SampleTimeout = t.AsDuration()
	}
	if err := why("why", r.Why, false); err != nil {
		return r, err
	}
	return r, nil
}

func (s *service) GetReplay(_ context.Context, req *adminv1.GetReplayRequest) (*adminv1.Replay, error) {
	dl, err := s.deadLetters()
	if err != nil {
		return nil, err
	}
	if req.GetId() == "" {
		return nil, grpcstatus.Error(codes.InvalidArgument, "id is required")
	}
	run, err := dl.Replay(req.GetId())
	if err != nil {
		return nil, s.fail("reading a replay", err)
	}
	return runProto(&run, true), nil
}

func (s *service) ListReplays(_ context.Context, req *adminv1.ListReplaysRequest) (*adminv1.ListReplaysResponse, error) {
	dl, err := s.deadLetters()
	if err != nil {
		return nil, err
	}
	if src := req.GetSource(); src != "" && !slices.Contains(dl.SourceNames(), src) {
		return nil, grpcstatus.Errorf(codes.NotFound, "%v: %q", deadletter.ErrNoSource, src)
	}
	runs, err := dl.Replays(req.GetSource())
	if err != nil {
		return nil, s.fail("listing replays", err)
	}
	out := &adminv1.ListReplaysResponse{}
	for i := range runs {
		out.Replays = append(out.Replays, runProto(&runs[i], false))
	}
	return out, nil
}

func (s *service) CancelReplay(ctx context.Context, req *adminv1.CancelReplayRequest) (*adminv1.Replay, error) {
	return s.operate(ctx, "cancelling a replay", req.GetId(), req.GetOperator(), req.GetReason(), DeadLetters.CancelReplay)
}

func (s *service) PauseReplay(ctx context.Context, req *adminv1.PauseReplayRequest) (*adminv1.Replay, error) {
	return s.operate(ctx, "pausing a replay", req.GetId(), req.GetOperator(), req.GetReason(), DeadLetters.PauseReplay)
}

func (s *service) ResumeReplay(ctx context.Context, req *adminv1.ResumeReplayRequest) (*adminv1.Replay, error) {
	return s.operate(ctx, "resuming a replay", req.GetId(), req.GetOperator(), req.GetReason(), DeadLetters.ResumeReplay)
}

// operate is an operator's cancel, pause or resume of a replay: the id is
// required, the operator and reason checked, then do records it.
func (s *service) operate(ctx context.Context, what, id, operator, reason string,
	do func(DeadLetters, context.Context, string, string, string) (deadletter.Run, error)) (*adminv1.Replay, error) {
	dl, err := s.deadLetters()
	if err != nil {
		return nil, err
	}
	if id == "" {
		return nil, grpcstatus.Error(codes.InvalidArgument, "id is required")
	}
	who, err := s.who(operator)
	if err != nil {
		return nil, err
	}
	if err := why("reason", reason, false); err != nil {
		return nil, err
	}
	run, err := do(dl, ctx, id, who, reason)
	if err != nil {
		return nil, s.fail(what, err)
	}
	return runProto(&run, true), nil
}
