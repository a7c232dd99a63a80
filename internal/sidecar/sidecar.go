// Package sidecar assembles Handoff from its configuration: Build makes and
// binds every part — the app client, the journal, the sources, the engine,
// the dead letters, telemetry and the admin API — and Run runs them in one
// group until the context ends or a part fails, then stops them in the order
// written in Run and closes them in the order written in close.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"handoff.dev/handoff/internal/admin"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/telemetry"
)

// Options are what a sidecar is built with besides its configuration. The
// zero value, with a Logger, is production.
type Options struct {
	Logger *slog.Logger
	// TracerProvider, when set, is where the attempts' spans go (a test's
	// in-memory one), in place of telemetry.otlp_endpoint's.
	TracerProvider trace.TracerProvider
	// App, when set, wraps the client the engine calls the app through:
	// sidecar dev's account of an app of the user's own sees each answer
	// so.
	App func(dispatch.Deliverer) dispatch.Deliverer
	// Fault is the engine's crash-window hook (dispatch.Options.Fault),
	// for the tests that break a sidecar in each window.
	Fault func(dispatch.Window, journal.Key) error
	// BeforeCommit is the journal writer's hook
	// (journal.Options.BeforeCommit), for tests.
	BeforeCommit func(records int) error
	// Part is run as one more part of the sidecar, beside its sources and
	// servers: a test fails it to see the rest stop.
	Part func(ctx context.Context) error
}

// ConfigError is a configuration the sidecar refuses once it reads it
// whole (a token file others may read, an outcome mapping it cannot use):
// the command exits 2 on it, as on a config file's problems.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

func configError(err error) error { return &ConfigError{Err: err} }

// Sidecar is a built sidecar: every part made and every listener bound,
// nothing running until Run.
type Sidecar struct {
	cfg     config.Config
	log     *slog.Logger
	part    func(ctx context.Context) error
	started time.Time

	app         appClient
	journal     *journal.Journal
	metrics     *telemetry.Metrics
	stopMetrics func()
	sources     []source
	dlIndex     *deadletter.Index
	deadLetters *deadletter.Manager
	stopTracing func()
	batcher     *handler.Batcher
	engine      *dispatch.Engine
	sampler     *telemetry.Sampler
	activity    *telemetry.History
	health      *telemetry.Server
	admin       *admin.Server

	// running is Run's context while it runs: its end is the first step
	// of a stop, when /readyz turns to "shutting down".
	running atomic.Pointer[context.Context]
	// drainAsked ends Run as a signal would (shutdown.http_drain), and
	// drained is closed once the engine has drained.
	drainAsked context.Context
	askDrain   context.CancelFunc
	drained    chan struct{}
}

// Build makes every part of the sidecar cfg describes and binds its
// listeners. On an error it closes what it made; a *ConfigError is a
// configuration it refuses.
func Build(cfg config.Config, o Options) (_ *Sidecar, err error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Sidecar{cfg: cfg, log: log, part: o.Part, started: time.Now(), drained: make(chan struct{})}
	s.drainAsked, s.askDrain = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	policy := policyFrom(cfg.Retry)
	classifier, err := cfg.Outcomes.Classifier()
	if err != nil {
		return nil, configError(err)
	}
	if s.app, err = newAppClient(cfg.Handler, classifier); err != nil {
		return nil, err
	}
	// Refused before the journal opens and the brokers are dialled.
	adminTok, err := AdminToken(cfg.Admin)
	if err != nil {
		return nil, err
	}
	if err := s.openJournal(o.BeforeCommit); err != nil {
		return nil, err
	}
	for _, sc := range cfg.Sources {
		src, err := buildSource(sc, sourceNeeds{
			tiers:               policy.Tiers,
			deadLetterRetention: cfg.DeadLetter.Retention.D(),
			maxMessageBytes:     int(cfg.Handler.MaxMessageBytes),
			maxConcurrency:      cfg.Handler.MaxConcurrency,
			journal:             s.journal,
			log:                 log,
		})
		if err != nil {
			return nil, err
		}
		s.sources = append(s.sources, src)
	}
	if err := s.openDeadLetters(); err != nil {
		return nil, err
	}
	tracer, err := s.tracer(o.TracerProvider)
	if err != nil {
		return nil, err
	}
	s.buildEngine(policy, tracer, o)
	if err := s.observe(); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	checks := s.checks()
	if err := s.listenHealth(checks); err != nil {
		return nil, err
	}
	if err := s.listenAdmin(adminTok, checks); err != nil {
		return nil, err
	}
	return s, nil
}

// HealthAddr is the health server's bound address; "" when it is off.
func (s *Sidecar) HealthAddr() string {
	if s.health == nil {
		return ""
	}
	return s.health.Addr()
}

// AdminAddr is the admin API's bound address; "" when it is off.
func (s *Sidecar) AdminAddr() string {
	if s.admin == nil {
		return ""
	}
	return s.admin.Addr()
}

// openJournal opens the journal and, once it says which replica this is,
// the metrics, which measure its commits and evictions from then on.
func (s *Sidecar) openJournal(beforeCommit func(int) error) error {
	cfg, log := s.cfg, s.log
	var committed atomic.Pointer[telemetry.Metrics]
	// The default path is in a state directory that may not exist yet.
	if err := os.MkdirAll(filepath.Dir(cfg.Journal.Path), 0o700); err != nil {
		return fmt.Errorf("journal.path: %w", err)
	}
	syncMode, err := cfg.Journal.SyncMode()
	if err != nil {
		return configError(err)
	}
	jr, recovered, err := journal.Open(cfg.Journal.Path, journal.Options{
		Sync:         syncMode,
		Linger:       cfg.Journal.Linger.D(),
		Retention:    cfg.Journal.Retention.D(),
		MaxSize:      int64(cfg.Journal.MaxSize),
		Logger:       log,
		BeforeCommit: beforeCommit,
		OnCommit: func(took time.Duration) {
			if m := committed.Load(); m != nil {
				m.Committed(took)
			}
		},
		OnEvict: func(n int) {
			if m := committed.Load(); m != nil {
				m.Evicted(n)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("open journal: %w", err)
	}
	s.journal = jr
	if s.metrics, s.stopMetrics, err = newMetrics(cfg.Telemetry, jr.InstanceID()); err != nil {
		return configError(err)
	}
	committed.Store(s.metrics)
	if recovered.Open > 0 {
		log.Warn("journal: hand-offs left open by the previous run; each resumes where it stopped when the broker redelivers it",
			"path", cfg.Journal.Path, "open", recovered.Open, "received", recovered.Received, "in_call", recovered.InCall,
			"handled_not_acked", recovered.Handled, "copy_unconfirmed", recovered.Unconfirmed,
			"copy_confirmed_not_acked", recovered.Confirmed, "failed_without_copy", recovered.Failed)
	} else {
		log.Info("journal opened", "path", cfg.Journal.Path, "sync", syncMode)
	}
	// The replica's name in the dead-letter ledger (a replay's runner) and
	// in its Kafka group members' ids.
	log.Info("replica", "instance_id", jr.InstanceID())
	return nil
}

// openDeadLetters opens the dead-letter index and its manager over the
// sources' dead-letter logs.
func (s *Sidecar) openDeadLetters() error {
	path := s.cfg.DeadLetter.Index
	if path == "" {
		path = s.cfg.Journal.Path + ".deadletters"
	}
	idx, err := deadletter.Open(path, deadletter.Options{Logger: s.log})
	if err != nil {
		return err
	}
	s.dlIndex = idx
	managed := make([]deadletter.ManagedSource, len(s.sources))
	for i, src := range s.sources {
		managed[i] = src.deadLetters
	}
	s.deadLetters = deadletter.NewManager(deadletter.ManagerOptions{
		Index:   idx,
		Sources: managed,
		Replica: s.journal.InstanceID(),
		// A replay shares the app with live traffic, which goes first:
		// it waits while fresh intake does. The engine is built next.
		Pressure:     func() string { return s.engine.Status().Paused() },
		Logger:       s.log,
		Poll:         s.cfg.DeadLetter.Poll.D(),
		HeartbeatTTL: s.cfg.DeadLetter.ReplayTakeover.D(),
	})
	return nil
}

// buildEngine builds the engine over the sources' routes, calling the app
// through the batcher when batches are on.
func (s *Sidecar) buildEngine(policy *budget.Policy, tracer trace.Tracer, o Options) {
	cfg := s.cfg
	// One budget pays for re-attempts and for the extra requests of
	// splitting a failed batch alike: both are load that failures add.
	retryBudget := budget.NewRetryBudget(cfg.Budget.Ratio, cfg.Budget.MinPerSecond, cfg.Budget.Window.D(), nil)
	var deliverer dispatch.Deliverer = s.app
	if b := cfg.Handler.Batch; b.MaxMessages > 1 {
		s.batcher = handler.NewBatcher(s.app, handler.BatchOptions{
			MaxMessages: b.MaxMessages, MaxWait: b.MaxWait.D(), MinCall: policy.MinAttempt, Budget: retryBudget,
		})
		deliverer = s.batcher
	}
	if o.App != nil {
		deliverer = o.App(deliverer)
	}
	routes := make([]dispatch.Route, len(s.sources))
	for i, src := range s.sources {
		routes[i] = src.route
	}
	s.engine = dispatch.New(dispatch.Options{
		Routes:                routes,
		Handler:               deliverer,
		Policy:                policy,
		Journal:               s.journal,
		Timeout:               cfg.Handler.Timeout.D(),
		MaxConcurrency:        cfg.Handler.MaxConcurrency,
		DrainTimeout:          cfg.Shutdown.DrainTimeout.D(),
		Logger:                s.log,
		Fault:                 o.Fault,
		Budget:                retryBudget,
		TrustProducerDeadline: cfg.Retry.TrustProducerDeadline,
		MaxMessageBytes:       int(cfg.Handler.MaxMessageBytes),
		Replayed:              s.deadLetters.Handled,
		Observer:              s.metrics,
		Tracer:                tracer,
	})
}

// checks are /readyz's questions, in order. Not ready is the first step of
// a stop: the moment Run's context ends, before intake stops, so that no
// new traffic is routed to a sidecar going away.
func (s *Sidecar) checks() []telemetry.Check {
	checks := []telemetry.Check{{Name: "sidecar", Own: true, Ready: func() error {
		if run := s.running.Load(); run == nil || (*run).Err() != nil {
			return errors.New("shutting down")
		}
		return nil
	}}}
	for _, src := range s.sources {
		checks = append(checks, telemetry.Check{Name: "source " + src.name, Ready: src.status.Ready})
	}
	return append(checks,
		telemetry.Check{Name: "app", Ready: s.engine.Ready},
		// No room for the journal: intake waits, and says why.
		telemetry.Check{Name: "journal", Ready: s.journal.NoRoom})
}

// listenHealth binds the health endpoints and /metrics, when
// telemetry.metrics_listen is set; with shutdown.http_drain, a drain asked
// there stops the sidecar as a signal would, and its answer waits for the
// engine's drain.
func (s *Sidecar) listenHealth(checks []telemetry.Check) error {
	if s.cfg.Telemetry.MetricsListen == "" {
		return nil
	}
	hs, err := telemetry.Listen(s.cfg.Telemetry.MetricsListen, checks, s.metrics.Handler(), s.log)
	if err != nil {
		return err
	}
	s.health = hs
	if s.cfg.Shutdown.HTTPDrain {
		hs.HandleDrain(s.cfg.Shutdown.DrainToken, func(req context.Context) error {
			s.askDrain()
			select {
			case <-s.drained:
				return nil
			case <-req.Done():
				return req.Err()
			}
		})
	}
	s.log.Info("health endpoints listening", "addr", hs.Addr())
	return nil
}

// policyFrom builds the retry policy from config.
func policyFrom(r config.Retry) *budget.Policy {
	tiers := make([]time.Duration, len(r.Tiers))
	for i, t := range r.Tiers {
		tiers[i] = t.D()
	}
	return &budget.Policy{
		MaxAttempts: r.MaxAttempts,
		Base:        r.Base.D(),
		Cap:         r.Cap.D(),
		Tiers:       tiers,
		Deadline:    r.Deadline.D(),
		DeferMaxAge: r.DeferMaxAge.D(),
		MinAttempt:  r.MinAttempt.D(),
		Jitter:      rand.Float64,
	}
}
