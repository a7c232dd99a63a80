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

// The text of `sidecar status` and `sidecar events`, from fixed answers.
func TestStatusAndEvents(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	st := &adminv1.Status{
		StartedAt: timestamppb.New(t0.Add(-time.Hour)),
		NotReady:  "app: app unreachable",
		Calls: &adminv1.Calls{InFlight: 3, Limit: 12, Max: 64, Queued: 5, FreshIntakePaused: true, AppUnreachable: true,
			OverloadUntil: timestamppb.New(t0.Add(30 * time.Second))},
		Budget:  &adminv1.Budget{Tokens: 0.25, Denied: 17},
		Journal: &adminv1.Journal{Path: "/var/lib/handoff/handoff.db", SizeBytes: 3 << 20, Open: 3, CommitP50: durationpb.New(1200 * time.Microsecond), CommitMax: durationpb.New(7 * time.Millisecond)},
		Sources: []*adminv1.SourceStatus{
			{Name: "orders", Broker: "rabbitmq", From: "orders", Connected: true, State: "paused", Reason: "app unreachable: intake waits until it accepts connections again",
				InFlight: 3, OldestUnsettledAge: durationpb.New(2500 * time.Millisecond), RetryTiers: []*adminv1.RetryTier{
					{Name: "orders.retry.1s", Delay: durationpb.New(time.Second), Waiting: 4, Known: true},
					{Name: "orders.retry.1m", Delay: durationpb.New(time.Minute), Known: true},
				}},
			{Name: "payments", Broker: "kafka", From: "payments", State: "paused", Reason: "not connected: no broker answers", RetryTiers: []*adminv1.RetryTier{
				{Name: "payments.handler.retry.1s", Delay: durationpb.New(time.Second)},
			}},
			{Name: "jobs", Broker: "kafka", From: "jobs", Connected: true, State: "consuming", InFlight: 7,
				ShareGroup: &adminv1.ShareGroup{Name: "workers", RetryGroup: "workers.retries", DeliveryCountLimit: 5,
					LockDuration: durationpb.New(30 * time.Second), ReadFrom: "brokers"}},
		},
	}
	var b bytes.Buffer
	Status(&b, st, t0)
	testkit.Golden(t, "status.golden", b.String())

	ev := &adminv1.Event{Source: "orders", EventId: "order-1", Handoffs: []*adminv1.Handoff{
		{Steps: []*adminv1.Step{
			{At: timestamppb.New(t0), Kind: "received", Text: "received     hop 0"},
			{At: timestamppb.New(t0.Add(time.Millisecond)), Kind: "settled", Text: "settled      hop 0: handled"},
		}},
		{ReplayId: "r1", Steps: []*adminv1.Step{{At: timestamppb.New(t0.Add(time.Hour)), Kind: "received", Text: "received     hop 0"}}},
	}}
	b.Reset()
	Event(&b, ev)
	testkit.Golden(t, "events.golden", b.String())
}
