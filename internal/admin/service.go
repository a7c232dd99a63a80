package admin

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/telemetry"
)

// Engine is what the admin API reads of the dispatch engine. Status must be
// safe for concurrent use.
type Engine interface {
	Status() dispatch.Status
}

// Journal is what the admin API reads of the running sidecar's journal. Its
// methods must be safe for concurrent use with the journal's writer.
type Journal interface {
	Stats() (journal.Stats, error)
	// Event is every hand-off of one event of one source, each's timeline.
	Event(source, eventID string) ([][]journal.Step, error)
}

// Source is one configured source as the admin API shows it.
type Source struct {
	Name string
	// Broker is rabbitmq or kafka; From the queue or topic.
	Broker, From string
	// Ready reports why the source's broker cannot be used now; nil when it
	// can. Nil means always usable.
	Ready func() error
	// Tiers are the source's retry tiers, in delay order.
	Tiers []Tier
	// Waiting reads how many copies wait in each tier, in Tiers order; nil
	// when the broker cannot say. It must honour ctx.
	Waiting func(ctx context.Context) ([]int64, error)
	// Backlog is the source's backlog estimate, and false until there is
	// one; nil when none is kept.
	Backlog func() (telemetry.Estimate, bool)
	// Share reads the Kafka share group the source consumes through; nil
	// for a consumer group or a queue.
	Share func() ShareGroup
}

// ShareGroup is a Kafka share group's limits as the sidecar read them.
type ShareGroup struct {
	Name, RetryGroup string
	Limit            int
	Lock             time.Duration
	// ReadFrom is group, brokers or defaults.
	ReadFrom string
}

// Tier is one retry tier of a source.
type Tier struct {
	// Name is its queue or topic.
	Name  string
	Delay time.Duration
}

// service implements adminv1.AdminServer over the running sidecar.
type service struct {
	adminv1.UnimplementedAdminServer
	o   Options
	log *slog.Logger
}

var _ adminv1.AdminServer = (*service)(nil)

func (s *service) GetStatus(ctx context.Context, _ *adminv1.GetStatusRequest) (*adminv1.Status, error) {
	r := s.read(ctx)
	if r.journalErr != nil {
		s.log.Warn("admin: reading the journal", "err", r.journalErr)
	}
	return statusOf(r), nil
}

func (s *service) GetEvent(_ context.Context, req *adminv1.GetEventRequest) (*adminv1.Event, error) {
	if req.GetSource() == "" || req.GetEventId() == "" {
		return nil, grpcstatus.Error(codes.InvalidArgument, "source and event_id are required")
	}
	known := false
	for _, src := range s.o.Sources {
		known = known || src.Name == req.GetSource()
	}
	if !known {
		return nil, grpcstatus.Errorf(codes.NotFound, "no source named %q", req.GetSource())
	}
	handoffs, err := s.o.Journal.Event(req.GetSource(), req.GetEventId())
	if err != nil {
		s.log.Warn("admin: reading the journal", "err", err)
		return nil, grpcstatus.Error(codes.Internal, "reading the journal failed")
	}
	if len(handoffs) == 0 {
		return nil, grpcstatus.Errorf(codes.NotFound, "the journal holds no hand-off of event %q from source %q", req.GetEventId(), req.GetSource())
	}
	return event(req.GetSource(), req.GetEventId(), handoffs), nil
}
