package report

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/testkit"
)

// What the replay commands print, from fixed answers: a start (and a dry
// run), the live bar's line, a replay's detail, the list and the summary
// of a run that stopped, with a runner's id that would steer a terminal.
func TestReplays(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	running := &adminv1.Replay{Id: "r-7", Source: "orders", State: "running", CreatedAt: timestamppb.New(t0), CreatedBy: "ops",
		Why: "fixed the schema", RatePerSecond: 10, BatchSize: 10, Sample: 5, StopFailureRatio: 0.5,
		Runner: "replica-a\x1b[2J", HeartbeatAt: timestamppb.New(t0.Add(3 * time.Second)),
		Progress: &adminv1.Progress{Selected: 40, Published: 12, Handled: 10, Failed: 1, Remaining: 28, Rate: 9.6,
			Waited: durationpb.New(4 * time.Second), Eta: durationpb.New(3 * time.Second)}}
	paused := &adminv1.Replay{Id: "r-8", Source: "billing", State: "running", Paused: true,
		Detail: "app unreachable: intake waits until it accepts connections again", CreatedAt: timestamppb.New(t0.Add(time.Minute)),
		CreatedBy: "ops", RatePerSecond: 2, BatchSize: 5, StopFailureRatio: 1, Force: true,
		Progress: &adminv1.Progress{Selected: 1, Remaining: 1}}
	stopped := &adminv1.Replay{Id: "r-6", Source: "orders", State: "stopped", Detail: "3 of the sample of 5 failed",
		CreatedAt: timestamppb.New(t0.Add(-time.Hour)), EndedAt: timestamppb.New(t0.Add(-time.Hour + time.Minute)), CreatedBy: "ops",
		RatePerSecond: 10, BatchSize: 10, Sample: 5, StopFailureRatio: 0.5,
		Progress: &adminv1.Progress{Selected: 40, Published: 5, Handled: 2, Failed: 3, Remaining: 35}}
	dry := &adminv1.Replay{DryRun: true, Source: "orders", Ids: []string{"orders.dlq/1", "orders.dlq/2"}}

	var b bytes.Buffer
	ReplayStarted(&b, running)
	ReplayStarted(&b, dry)
	b.WriteString(Progress(running) + "\n" + Progress(paused) + "\n\n")
	Replay(&b, running)
	b.WriteString("\n")
	Replay(&b, paused)
	b.WriteString("\n")
	Replays(&b, &adminv1.ListReplaysResponse{Replays: []*adminv1.Replay{running, paused, stopped}})
	Replays(&b, &adminv1.ListReplaysResponse{})
	b.WriteString("\n")
	ReplaySummary(&b, stopped)
	ReplaySummary(&b, running)
	testkit.Golden(t, "replays.golden", b.String())
}
