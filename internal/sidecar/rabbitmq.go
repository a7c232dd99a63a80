package sidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"handoff.dev/handoff/internal/admin"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/dispatch"
)

// An unconfirmed dead-letter copy is looked for in the dead-letter stream
// before it is written again.
var _ dispatch.CopyFinder = (*rabbitmq.Client)(nil)

// rabbitSource builds a RabbitMQ source: its queue and the delay tiers'
// retry consumer feed one route.
func rabbitSource(name string, r *config.RabbitMQ, n sourceNeeds) (source, error) {
	var tlsConfig *tls.Config
	if r.TLS != nil {
		var err error
		if tlsConfig, err = clientTLS(name, r.TLS, n.log); err != nil {
			return source{}, err
		}
	}
	c := rabbitmq.NewClient(rabbitmq.Options{
		Name:     name,
		URL:      r.URL,
		Queue:    r.Queue,
		Prefetch: r.Prefetch,
		// Set by the defaults; nil only for a config built by hand.
		DeliveryLimit: deref(r.DeliveryLimit),
		Tiers:         n.tiers,
		Declare:       r.Declare == nil || *r.Declare,
		// Applies when the sidecar declares the dead-letter stream.
		DeadLetterRetention: n.deadLetterRetention,
		Logger:              n.log,
		TLS:                 tlsConfig,
		Login:               rabbitLogin(r),
	})
	// AMQP 0-9-1 cannot tell a consumer a queue's limit: say which one
	// the sidecar keeps its messages under.
	if limit := deref(r.DeliveryLimit); limit > 0 {
		n.log.Info("delivery limit: a message on its final delivery is moved to a retry tier, never called",
			"source", name, "delivery_limit", limit)
	} else {
		n.log.Info("delivery limit: none (the queues drop nothing after repeated returns)", "source", name)
	}
	warnPrefetch(n, name, r.Prefetch)
	status := admin.Source{Name: name, Broker: "rabbitmq", From: r.Queue,
		Ready: func() error {
			if c.Connected() {
				return nil
			}
			if err := c.LastError(); err != nil {
				if why, ok := rabbitmq.Refusal(err); ok {
					return fmt.Errorf("broker not connected: refused: %s", why)
				}
				return fmt.Errorf("broker not connected: %w", err)
			}
			return errors.New("broker not connected")
		},
		// The copies ready in each delay tier.
		Waiting: func(ctx context.Context) ([]int64, error) {
			ds, err := c.RetryDepths(ctx)
			if err != nil {
				return nil, err
			}
			out := make([]int64, len(ds))
			for i, d := range ds {
				out[i] = int64(d.Ready)
			}
			return out, nil
		},
	}
	for _, t := range n.tiers {
		status.Tiers = append(status.Tiers, admin.Tier{Name: rabbitmq.TierQueue(r.Queue, t), Delay: t})
	}
	return source{
		name: name,
		route: dispatch.Route{
			Name:        name,
			System:      "rabbitmq",
			Destination: r.Queue,
			Sources:     []dispatch.Source{c.Source(), c.RetrySource()},
			Transfer:    c,
			CESource:    "/rabbitmq/" + r.Queue,
		},
		status: status,
		backlog: func(ctx context.Context) (int64, int64, bool, error) {
			b, err := c.Backlog(ctx)
			return b, 0, false, err
		},
		deadLetters: deadletter.ManagedSource{
			Source:      deadletter.Source{Name: name, DLQ: c.DeadLetterLog(), Ledger: c.LedgerLog()},
			Republisher: c,
		},
		// Run keeps the connection up and closes it when its ctx ends.
		run:   c.Run,
		close: func() {},
	}, nil
}

// rabbitLogin is a RabbitMQ source's login when it has credentials of its
// own: read at each connect, so a rotated password file is taken up.
func rabbitLogin(r *config.RabbitMQ) func() (string, string, error) {
	if !r.Credentials.IsSet() {
		return nil
	}
	creds := r.Credentials
	return func() (string, string, error) {
		user, err := creds.User()
		if err != nil {
			return "", "", err
		}
		password, err := creds.Secret()
		return user, password, err
	}
}

// warnPrefetch says when a source's prefetch holds its calls back. A
// delivery takes room in the prefetch from its hand-out until its ack,
// which waits for its outcome's commit to the journal: the deliveries
// waiting for a commit take room as the calls do, which is why the default
// is four a call (config.DefaultPrefetch).
func warnPrefetch(n sourceNeeds, name string, prefetch int) {
	def := config.DefaultPrefetch(n.maxConcurrency)
	switch {
	case prefetch < n.maxConcurrency:
		n.log.Warn("prefetch is below handler.max_concurrency: this source cannot use all of it",
			"source", name, "prefetch", prefetch, "max_concurrency", n.maxConcurrency)
	case prefetch < def:
		n.log.Info("prefetch is below its default for handler.max_concurrency: a delivery is acked once its outcome is committed, and those waiting for the commit hold the prefetch too, so calls may wait for deliveries",
			"source", name, "prefetch", prefetch, "default", def, "max_concurrency", n.maxConcurrency)
	}
}
