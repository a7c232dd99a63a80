package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/redact"
	"handoff.dev/handoff/internal/telemetry"
)

func runCmd() *cobra.Command {
	var path, cpuProfile, allocProfile string
	cmd := &cobra.Command{
		Use:   "run --config FILE",
		Short: "Consume every configured source and hand each message to the app",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			// Set up before the CPU profile, so that it is written after that
			// stops and its collection stays out of it.
			if allocProfile != "" {
				f, err := os.Create(allocProfile)
				if err != nil {
					return &exitError{code: exitConfig, err: fmt.Errorf("--alloc-profile: %w", err)}
				}
				defer func() {
					runtime.GC() // the profile counts up to the last collection
					err := pprof.Lookup("allocs").WriteTo(f, 0)
					if cerr := f.Close(); err == nil {
						err = cerr
					}
					if err != nil {
						log.Error("writing the allocation profile", "err", err)
					}
				}()
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return &exitError{code: exitConfig, err: fmt.Errorf("--cpu-profile: %w", err)}
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			return serve(cmd.Context(), cfg, log, hooks{})
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "", "config file (required)")
	cmd.Flags().StringVar(&cpuProfile, "cpu-profile", "", "write a CPU profile (pprof) of the whole run to this file")
	cmd.Flags().StringVar(&allocProfile, "alloc-profile", "", "write a profile (pprof) of the run's allocations to this file when it stops")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

func newLogger(cmd *cobra.Command) (*slog.Logger, error) {
	levelName, _ := cmd.Flags().GetString("log-level")
	format, _ := cmd.Flags().GetString("log-format")
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, &exitError{code: exitConfig, err: fmt.Errorf("--log-level: %w", err)}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(format) {
	case "":
		// A sidecar's log goes to a collector, which reads JSON.
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, &exitError{code: exitConfig, err: fmt.Errorf("--log-format: want text or json, got %q", format)}
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

// hooks let tests watch and break a running sidecar; the zero value is
// production.
type hooks struct {
	// healthAddr is told the health server's bound address.
	healthAddr func(string)
	// fault is the engine's crash-window hook (dispatch.Options.Fault).
	fault func(dispatch.Window, journal.Key) error
	// beforeCommit is the journal writer's hook (journal.Options.BeforeCommit).
	beforeCommit func(records int) error
	// adminAddr is told the admin server's bound address.
	adminAddr func(string)
	// part is run as one more part of the sidecar, beside its sources,
	// health server and engine: a test fails it to see the rest stop.
	part func(ctx context.Context) error
	// tracerProvider, when set, is where the attempts' spans go (a test's
	// in-memory one), in place of telemetry.otlp_endpoint's.
	tracerProvider trace.TracerProvider
}

// serve runs the sidecar until ctx is done, then shuts down in order: not
// ready → stop intake → finish or hand back in-flight → close broker
// connections → stop the health server → close the journal.
func serve(ctx context.Context, cfg config.Config, log *slog.Logger, hk hooks) error {
	policy := policyFrom(cfg.Retry)
	classifier, err := handler.NewClassifier(cfg.Outcomes.HTTP)
	if err != nil {
		return &exitError{code: exitConfig, err: fmt.Errorf("outcomes.http: %w", err)}
	}
	if classifier, err = classifier.WithGRPC(cfg.Outcomes.GRPC); err != nil {
		return &exitError{code: exitConfig, err: fmt.Errorf("outcomes.grpc: %w", err)}
	}
	app, err := newAppClient(cfg.Handler, classifier)
	if err != nil {
		return err
	}
	defer app.Close()

	// Refused before the journal opens and the brokers are dialled.
	started := time.Now()
	adminTok, err := adminToken(cfg.Admin)
	if err != nil {
		return err
	}

	// The metrics are made once the journal says which replica this is;
	// its commits and evictions are measured from then on.
	var committed atomic.Pointer[telemetry.Metrics]
	syncMode, _ := journal.ParseSyncMode(cfg.Journal.Sync)
	jr, recovered, err := journal.Open(cfg.Journal.Path, journal.Options{
		Sync:         syncMode,
		Linger:       cfg.Journal.Linger.D(),
		Retention:    cfg.Journal.Retention.D(),
		MaxSize:      int64(cfg.Journal.MaxSize),
		Logger:       log,
		BeforeCommit: hk.beforeCommit,
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
	defer func() {
		if err := jr.Close(); err != nil {
			log.Error("close journal", "err", err)
		}
	}()
	metrics, stopMetrics, err := newMetrics(cfg.Telemetry, jr.InstanceID())
	if err != nil {
		return &exitError{code: exitConfig, err: err}
	}
	defer stopMetrics()
	committed.Store(metrics)
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

	var (
		sources []source
		routes  []dispatch.Route
		checks  []telemetry.Check
	)
	for _, sc := range cfg.Sources {
		src, err := buildSource(sc, policy.Tiers, cfg.DeadLetter.Retention.D(), int(cfg.Handler.MaxMessageBytes), jr, log)
		if err != nil {
			for _, b := range sources {
				b.close()
			}
			return err
		}
		sources = append(sources, src)
		routes = append(routes, src.route)
		checks = append(checks, telemetry.Check{Name: "source " + sc.Name, Ready: src.ready})
		if r := sc.RabbitMQ; r != nil {
			// AMQP 0-9-1 cannot tell a consumer a queue's limit: say which
			// one the sidecar keeps its messages under.
			if n := deref(r.DeliveryLimit); n > 0 {
				log.Info("delivery limit: a message on its final delivery is moved to a retry tier, never called",
					"source", sc.Name, "delivery_limit", n)
			} else {
				log.Info("delivery limit: none (the queues drop nothing after repeated returns)", "source", sc.Name)
			}
		}
		if r := sc.RabbitMQ; r != nil && r.Prefetch < cfg.Handler.MaxConcurrency {
			log.Warn("prefetch is below handler.max_concurrency: this source cannot use all of it",
				"source", sc.Name, "prefetch", r.Prefetch, "max_concurrency", cfg.Handler.MaxConcurrency)
		}
	}

	dlIndexPath := cfg.DeadLetter.Index
	if dlIndexPath == "" {
		dlIndexPath = cfg.Journal.Path + ".deadletters"
	}
	dlIndex, err := deadletter.Open(dlIndexPath, deadletter.Options{Logger: log})
	if err != nil {
		for _, b := range sources {
			b.close()
		}
		return err
	}
	defer dlIndex.Close()
	var engine *dispatch.Engine // the replays' pressure reads it once it runs
	managed := make([]deadletter.ManagedSource, len(sources))
	for i, src := range sources {
		managed[i] = src.deadLetters
	}
	deadLetters := deadletter.NewManager(deadletter.ManagerOptions{
		Index:        dlIndex,
		Sources:      managed,
		Replica:      jr.InstanceID(),
		Pressure:     func() string { return replayPressure(engine.Status()) },
		Logger:       log,
		Poll:         cfg.DeadLetter.Poll.D(),
		HeartbeatTTL: cfg.DeadLetter.ReplayTakeover.D(),
	})

	tr, stopTracing, err := tracer(cfg.Telemetry, hk, jr.InstanceID())
	if err != nil {
		for _, b := range sources {
			b.close()
		}
		return &exitError{code: exitConfig, err: err}
	}
	defer stopTracing()

	// One budget pays for re-attempts and for the extra requests of
	// splitting a failed batch alike: both are load that failures add.
	retryBudget := budget.NewRetryBudget(cfg.Budget.Ratio, cfg.Budget.MinPerSecond, cfg.Budget.Window.D(), nil)
	var deliverer dispatch.Deliverer = app
	if b := cfg.Handler.Batch; b.MaxMessages > 1 {
		batcher := handler.NewBatcher(app, handler.BatchOptions{
			MaxMessages: b.MaxMessages, MaxWait: b.MaxWait.D(), MinCall: policy.MinAttempt, Budget: retryBudget,
		})
		defer batcher.Close()
		deliverer = batcher
	}
	engine = dispatch.New(dispatch.Options{
		Routes:                routes,
		Handler:               deliverer,
		Policy:                policy,
		Journal:               jr,
		Timeout:               cfg.Handler.Timeout.D(),
		MaxConcurrency:        cfg.Handler.MaxConcurrency,
		DrainTimeout:          cfg.Shutdown.DrainTimeout.D(),
		Logger:                log,
		Fault:                 hk.fault,
		Budget:                retryBudget,
		TrustProducerDeadline: cfg.Retry.TrustProducerDeadline,
		MaxMessageBytes:       int(cfg.Handler.MaxMessageBytes),
		Replayed:              deadLetters.Handled,
		Observer:              metrics,
		Tracer:                tr,
	})
	if err := observeEngine(metrics, engine, deadLetters); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	drains := newDrains(sources, metrics, cfg.Telemetry.DrainWindow.D(), log)
	if err := drains.observe(metrics); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	checks = append(checks, telemetry.Check{Name: "app", Ready: engine.Ready},
		// No room for the journal: intake waits, and says why.
		telemetry.Check{Name: "journal", Ready: jr.NoRoom})

	// The parts run in one group: the first to fail cancels run, which
	// stops intake as a signal would, and every part is joined before the
	// journal closes. Broker connections and the health server outlive
	// intake, in that order: the drain settles through the brokers, and the
	// health server says "not ready" all the while.
	// A drain asked for over HTTP (shutdown.http_drain) stops the sidecar
	// as a signal would; the engine's end is what its answer waits for.
	ctx, requestDrain := context.WithCancel(ctx)
	defer requestDrain()
	drained := make(chan struct{})
	g, run := errgroup.WithContext(ctx)
	// Not ready is the first step of a stop: the moment run ends, before
	// intake stops, so that no new traffic is routed to a sidecar going away.
	checks = append([]telemetry.Check{{Name: "sidecar", Own: true, Ready: func() error {
		if run.Err() != nil {
			return errors.New("shutting down")
		}
		return nil
	}}}, checks...)
	brokers, stopBrokers := context.WithCancel(context.Background())
	defer stopBrokers()
	servers, stopServers := context.WithCancel(context.Background())
	defer stopServers()
	defer func() {
		for _, src := range sources {
			src.close()
		}
	}()
	for _, src := range sources {
		g.Go(func() error { return part(brokers, "source "+src.name, src.run) })
	}
	// The dead letters stop after the engine's drain (whose replayed
	// copies' outcomes they record) and before the broker connections
	// they record them through.
	g.Go(func() error { return part(brokers, "backlog readings", drains.run) })
	dlRun, stopDeadLetters := context.WithCancel(context.Background())
	defer stopDeadLetters()
	dlDone := make(chan struct{})
	g.Go(func() error {
		defer close(dlDone)
		return part(dlRun, "dead letters", deadLetters.Run)
	})
	if cfg.Telemetry.MetricsListen != "" {
		hs, err := telemetry.Listen(cfg.Telemetry.MetricsListen, checks, metrics.Handler(), log)
		if err != nil {
			stopBrokers()
			stopDeadLetters()
			_ = g.Wait()
			return err
		}
		if cfg.Shutdown.HTTPDrain {
			hs.HandleDrain(cfg.Shutdown.DrainToken, func(req context.Context) error {
				requestDrain()
				select {
				case <-drained:
					return nil
				case <-req.Done():
					return req.Err()
				}
			})
		}
		log.Info("health endpoints listening", "addr", hs.Addr())
		if hk.healthAddr != nil {
			hk.healthAddr(hs.Addr())
		}
		g.Go(func() error { return part(servers, "health server", hs.Run) })
	}
	adm, err := listenAdmin(cfg, adminTok, started, engine, jr, sources, deadLetters, drains, &checks, log)
	if err != nil {
		stopBrokers()
		stopServers()
		stopDeadLetters()
		_ = g.Wait()
		return err
	}
	if adm != nil {
		log.Info("admin API listening", "addr", adm.Addr())
		if hk.adminAddr != nil {
			hk.adminAddr(adm.Addr())
		}
		g.Go(func() error { return part(servers, "admin server", adm.Run) })
	}
	if hk.part != nil {
		g.Go(func() error { return part(servers, "test part", hk.part) })
	}
	g.Go(func() error {
		// Whatever ends the engine — a signal, another part's failure, its
		// own — the brokers and servers stop after its drain.
		defer stopServers()
		defer stopBrokers()
		defer func() {
			stopDeadLetters()
			<-dlDone
		}()
		log.Info("sidecar running", "sources", len(routes), "handler", redact.URL(cfg.Handler.URL))
		err := engine.Run(run)
		close(drained)
		log.Info("intake stopped and in-flight settled; closing")
		return err
	})
	return g.Wait()
}

// part runs one long-lived part of the sidecar until ctx is done. It returns
// nil once ctx ended it, and otherwise names the part in its error: a part
// that stops by itself while the sidecar runs is a failure.
func part(ctx context.Context, name string, run func(context.Context) error) error {
	err := run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", name, err)
}

// source is one configured source, built: its route into the engine, its
// readiness, what runs while it is up (returning nil once ctx ends it, or
// once its work is done), and what closes it after the engine has stopped.
type source struct {
	name  string
	route dispatch.Route
	ready func() error
	run   func(ctx context.Context) error
	close func()
	// waiting reads the copies waiting in each retry tier; nil when the
	// broker cannot say.
	waiting func(ctx context.Context) ([]int64, error)
	// deadLetters are the source's dead-letter logs, and where a replay
	// republishes.
	deadLetters deadletter.ManagedSource
	// backlog reads the source's backlog and, where the broker says, the
	// count of messages ever produced to it (for the drain estimate).
	backlog func(ctx context.Context) (backlog, produced int64, producedKnown bool, err error)
}

// deadLetterRetention applies to the dead-letter destinations the sidecar
// creates; maxMessageBytes sizes Kafka's copies; jr keeps Kafka's handed-out
// marks and names the group members.
func buildSource(sc config.Source, tiers []time.Duration, deadLetterRetention time.Duration, maxMessageBytes int, jr *journal.Journal, log *slog.Logger) (source, error) {
	switch {
	case sc.RabbitMQ != nil:
		return rabbitSource(sc, tiers, deadLetterRetention, log)
	case sc.Kafka != nil:
		return kafkaSource(sc, tiers, deadLetterRetention, maxMessageBytes, jr, log)
	}
	return source{}, &exitError{code: exitConfig, err: fmt.Errorf("source %q: no broker configured", sc.Name)}
}

// replayPressure says why a replay must wait, from the engine's status: a
// replay shares the app with live traffic, which goes first.
func replayPressure(st dispatch.Status) string {
	switch {
	case st.AppUnreachable:
		return "the app is unreachable"
	case st.FreshIntakePaused:
		return "fresh intake is paused: the retry budget is spent"
	case time.Now().Before(st.OverloadUntil):
		return "the app answered overload: waiting out its Retry-After"
	}
	return ""
}
