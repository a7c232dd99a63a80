// Package dev is sidecar dev: the whole pipeline on an embedded Kafka
// (kfake), with a producer of demo orders, a demo app that fails some of
// them (or an app of the user's own), and the real sidecar between them,
// printing what happens to each order.
package dev

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/redact"
	"handoff.dev/handoff/internal/sidecar"
)

// Topic is the demo's source topic; Group its consumer group.
const (
	Topic = "demo.orders"
	Group = "demo"
)

// Options are sidecar dev's flags.
type Options struct {
	// Messages is how many orders are produced, Every apart.
	Messages int
	Every    time.Duration
	// UntilEnd stops the demo once every order is handled or dead-lettered.
	UntilEnd bool
	// Handler is the demo app's transport: http or grpc.
	Handler string
	// App is an app of the user's own, instead of the demo app.
	App string
	// Batch is handler.batch.max_messages.
	Batch int
	// Admin is the admin API's address; "" turns it off.
	Admin string
	// Command is how the account names the sidecar binary in the commands
	// it suggests.
	Command string
	// ShareGroup consumes the topic through a share group named Group
	// instead of a consumer group of that name.
	ShareGroup bool
}

// Run runs the demo until ctx ends (or, with UntilEnd, every order is
// settled), writing the account to out, and joins everything it started.
func Run(ctx context.Context, out io.Writer, o Options) error {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, Topic))
	if err != nil {
		return fmt.Errorf("embedded kafka: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	dir, err := os.MkdirTemp("", "handoff-dev-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// Every goroutine the demo starts is in wg, and joined before it
	// returns: cancel first, then the app stops, then the wait.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	acct := &account{out: out, start: time.Now(), state: map[string]string{}, demo: o.App == ""}
	if !acct.demo && o.Messages > 0 {
		acct.again = againWaiting
	}
	so := sidecar.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	appURL, shown, stopApp := o.App, redact.URL(o.App), func() {}
	if acct.demo {
		if appURL, shown, stopApp, err = startApp(&wg, o.Handler, acct); err != nil {
			return err
		}
		defer stopApp()
	} else {
		// Your own app: the account learns what it handled from the
		// answers the sidecar classifies.
		so.App = func(d dispatch.Deliverer) dispatch.Deliverer { return ownApp{d, acct} }
	}
	cfg, err := demoConfig(o, appURL, brokers, dir)
	if err != nil {
		return err
	}
	s, err := sidecar.Build(cfg, so)
	if err != nil {
		return err
	}

	if acct.demo {
		fmt.Fprintf(out, "Handoff dev: embedded Kafka at %s, topic %s, demo app at %s\n", brokers[0], Topic, shown)
		fmt.Fprintf(out, "Orders: most succeed; some fail once (busy) then succeed, some are rejected, one keeps failing.\n")
	} else {
		fmt.Fprintf(out, "Handoff dev: embedded Kafka at %s, topic %s, your app at %s\n", brokers[0], Topic, shown)
	}
	if o.ShareGroup {
		fmt.Fprintf(out, "Consumed through the share group %s: each order acquired and acknowledged alone, its delivery count kept by Kafka.\n", Group)
	}
	fmt.Fprintf(out, "Retry tiers 1s and 3s, max 4 attempts; dead letters go to %s. Ctrl-C to stop.\n\n", kafka.DeadLetterTopic(Topic, Group))
	fmt.Fprintf(out, "Metrics at http://%s/metrics (health: /readyz).\n", s.HealthAddr())
	if a := s.AdminAddr(); a != "" {
		tok, err := os.ReadFile(cfg.Admin.TokenFile)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "Console at http://%s/ui/ (token %s, kept in %s).\n", a, strings.TrimSpace(string(tok)), cfg.Admin.TokenFile)
		fmt.Fprintf(out, "Admin API at %s; in another terminal, while this runs:\n  %s dlq list --admin %s --token-file %s\n\n",
			a, o.Command, a, cfg.Admin.TokenFile)
	}

	done := make(chan error, 1)
	wg.Go(func() { done <- s.Run(ctx) })
	wg.Go(func() { produce(ctx, brokers, o.Messages, o.Every, acct) })
	wg.Go(func() { watch(ctx, brokers, acct) })
	if o.UntilEnd {
		wg.Go(func() {
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			for !acct.finished(o.Messages) {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
			cancel()
		})
	}
	err = <-done
	cancel()
	stopApp()
	wg.Wait()
	acct.totals(o.Messages)
	return err
}

// demoConfig is the sidecar's configuration for the demo: the embedded
// Kafka's topic, two retry tiers, a journal in dir and, unless it is off,
// the admin API with a token made for the run, so that the dead letters it
// makes can be listed, repaired and replayed with the CLI.
func demoConfig(o Options, appURL string, brokers []string, dir string) (config.Config, error) {
	cfg := config.Default()
	cfg.Handler.URL = appURL
	cfg.Handler.Timeout = config.Duration(2 * time.Second)
	cfg.Handler.MaxConcurrency = 8
	if o.Batch > 1 {
		// Long enough for the orders produced meanwhile to share a request.
		cfg.Handler.Batch = config.Batch{MaxMessages: o.Batch, MaxWait: config.Duration(100 * time.Millisecond)}
	}
	declare := true
	k := &config.Kafka{Brokers: brokers, Topic: Topic, Group: Group, Ordering: broker.OrderNone, Declare: &declare, MaxInFlight: 32}
	if o.ShareGroup {
		k.Group, k.ShareGroup = "", Group // the same name: the same copies' topics
	}
	cfg.Sources = []config.Source{{Name: "demo", Kafka: k}}
	cfg.Retry.MaxAttempts = 4
	cfg.Retry.Tiers = []config.Duration{config.Duration(time.Second), config.Duration(3 * time.Second)}
	cfg.Journal.Path = filepath.Join(dir, "handoff.db")
	cfg.Telemetry.MetricsListen = "127.0.0.1:0" // a free port, said at the start
	cfg.Shutdown.DrainTimeout = config.Duration(5 * time.Second)
	cfg.DeadLetter.Poll = config.Duration(200 * time.Millisecond)
	if o.Admin != "" {
		tok := make([]byte, 16)
		_, _ = rand.Read(tok)
		cfg.Admin.Listen, cfg.Admin.TokenFile = o.Admin, filepath.Join(dir, "admin.token")
		if err := os.WriteFile(cfg.Admin.TokenFile, []byte(hex.EncodeToString(tok)+"\n"), 0o600); err != nil {
			return cfg, err
		}
	}
	return cfg, cfg.Validate()
}

// ownApp is the client of an app of the user's own, which tells the
// account each order the app handled.
type ownApp struct {
	dispatch.Deliverer
	acct *account
}

func (a ownApp) Deliver(ctx context.Context, r *handler.Request) handler.Result {
	res := a.Deliverer.Deliver(ctx, r)
	if res.Outcome == budget.Success {
		a.acct.handled(r.EventID)
	}
	return res
}
