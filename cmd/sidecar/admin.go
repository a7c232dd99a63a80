package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"handoff.dev/handoff/internal/admin"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/telemetry"
)

// adminToken reads the admin API's token, when one is configured. A token
// file others may read is a configuration the sidecar refuses (exit 2), as
// is one that cannot be read.
func adminToken(a config.Admin) ([]byte, error) {
	if a.Token != "" {
		return []byte(a.Token), nil
	}
	if a.TokenFile == "" {
		return nil, nil
	}
	tok, err := admin.ReadToken(a.TokenFile)
	if err != nil {
		return nil, &exitError{code: exitConfig, err: fmt.Errorf("admin.token_file: %w", err)}
	}
	return tok, nil
}

// listenAdmin binds the admin API's listener; nil when the API is off.
func listenAdmin(cfg config.Config, token []byte, started time.Time, engine *dispatch.Engine, jr *journal.Journal,
	sources []source, deadLetters admin.DeadLetters, drains *drains, checks *[]telemetry.Check, log *slog.Logger) (*admin.Server, error) {
	if !cfg.Admin.Enabled() {
		log.Info("admin API off: admin.token_file is not set")
		return nil, nil
	}
	var srcs []admin.Source
	for i, sc := range cfg.Sources {
		src := adminSource(sc, sources[i], cfg.Retry.Tiers)
		if drains != nil {
			if d := drains.est[sc.Name]; d != nil {
				src.Backlog = d.Estimate
			}
		}
		srcs = append(srcs, src)
	}
	return admin.Listen(admin.Options{
		Listen:             cfg.Admin.Listen,
		Token:              token,
		AllowAnonymousRead: cfg.Admin.AllowAnonymousRead,
		TokenName:          cfg.Admin.TokenName,
		DeadLetters:        deadLetters,
		Started:            started,
		// The same reasons /readyz gives, the first of them.
		NotReady: func() error {
			for _, c := range *checks {
				if err := c.Ready(); err != nil {
					return errors.New(c.Name + ": " + err.Error())
				}
			}
			return nil
		},
		Engine:  engine,
		Journal: jr,
		Sources: srcs,
		Logger:  log,
	})
}

// adminSource is how the admin API shows one source.
func adminSource(sc config.Source, src source, tiers []config.Duration) admin.Source {
	out := admin.Source{Name: sc.Name, Ready: src.ready, Waiting: src.waiting}
	switch {
	case sc.RabbitMQ != nil:
		out.Broker, out.From = "rabbitmq", sc.RabbitMQ.Queue
		for _, t := range tiers {
			out.Tiers = append(out.Tiers, admin.Tier{Name: rabbitmq.TierQueue(sc.RabbitMQ.Queue, t.D()), Delay: t.D()})
		}
	case sc.Kafka != nil:
		out.Broker, out.From = "kafka", sc.Kafka.Topic
		if !sc.Kafka.Ordering.InPlace() { // ordered modes have no retry topics
			for _, t := range tiers {
				out.Tiers = append(out.Tiers, admin.Tier{Name: kafka.RetryTopic(sc.Kafka.Topic, sc.Kafka.Group, t.D()), Delay: t.D()})
			}
		}
	}
	return out
}

// rabbitWaiting reads the copies waiting in a RabbitMQ source's delay tiers.
func rabbitWaiting(c *rabbitmq.Client) func(ctx context.Context) ([]int64, error) {
	return func(ctx context.Context) ([]int64, error) {
		ds, err := c.RetryDepths(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]int64, len(ds))
		for i, d := range ds {
			out[i] = int64(d.Ready)
		}
		return out, nil
	}
}

// kafkaWaiting reads the group's lag on a Kafka source's retry topics.
func kafkaWaiting(c *kafka.Client) func(ctx context.Context) ([]int64, error) {
	return func(ctx context.Context) ([]int64, error) {
		ls, err := c.RetryLag(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]int64, len(ls))
		for i, l := range ls {
			out[i] = l.Lag
		}
		return out, nil
	}
}
