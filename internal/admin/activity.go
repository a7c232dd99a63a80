package admin

import (
	"context"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/telemetry"
)

// GetActivity answers each source's traffic over the last steps, from the
// sidecar's own history: the console charts it without Prometheus.
func (s *service) GetActivity(context.Context, *adminv1.GetActivityRequest) (*adminv1.Activity, error) {
	h := s.o.Activity
	out := &adminv1.Activity{Step: durationpb.New(telemetry.ActivityStep)}
	if h == nil {
		return out, nil
	}
	out.Step = durationpb.New(h.StepLength())
	steps := h.Snapshot()
	for i, name := range h.Sources() {
		sa := &adminv1.SourceActivity{Name: name}
		for _, st := range steps[i] {
			sa.Steps = append(sa.Steps, &adminv1.ActivityStep{At: timestamppb.New(st.At), Handled: st.Handled,
				Retried: st.Retried, DeadLettered: st.DeadLettered, Other: st.Other})
		}
		out.Sources = append(out.Sources, sa)
	}
	return out, nil
}
