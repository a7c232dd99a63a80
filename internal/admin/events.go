package admin

import (
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/journal"
)

// event makes the answer of GetEvent from the timelines of an event's
// hand-offs.
func event(source, eventID string, handoffs [][]journal.Step) *adminv1.Event {
	out := &adminv1.Event{Source: source, EventId: eventID}
	for _, steps := range handoffs {
		h := &adminv1.Handoff{}
		if len(steps) > 0 {
			h.ReplayId = steps[0].Key.ReplayID
		}
		for _, s := range steps {
			h.Steps = append(h.Steps, step(s.Record))
		}
		out.Handoffs = append(out.Handoffs, h)
	}
	return out
}

// step is one record of a timeline, with the line `sidecar journal events`
// prints for it.
func step(r journal.Record) *adminv1.Step {
	s := &adminv1.Step{
		Kind:    r.KindName(),
		Hop:     int32(r.Hop),
		Attempt: int32(r.Attempt),
		Status:  int32(r.Status),
		Dest:    r.Dest,
		Detail:  r.Detail,
		Text:    r.Text(),
	}
	if !r.At.IsZero() {
		s.At = timestamppb.New(r.At)
	}
	if r.Kind == journal.Outcome {
		s.Outcome = budget.Outcome(r.Outcome).String()
		s.Latency = durationpb.New(r.Latency)
	}
	return s
}
