package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/dispatch"
)

// An unconfirmed dead-letter copy is looked for before it is written again:
// Kafka reads the topic back, RabbitMQ browses the DLQ.
var (
	_ dispatch.CopyFinder = (*kafka.Client)(nil)
	_ dispatch.CopyFinder = (*rabbitmq.Client)(nil)

	_ dispatch.RetryHolder = (*kafka.Client)(nil)
)

func rabbitSource(sc config.Source, tiers []time.Duration, log *slog.Logger) source {
	r := sc.RabbitMQ
	c := rabbitmq.NewClient(rabbitmq.Options{
		Name:     sc.Name,
		URL:      r.URL,
		Queue:    r.Queue,
		Prefetch: r.Prefetch,
		Tiers:    tiers,
		Declare:  *r.Declare,
		Logger:   log,
	})
	return source{
		route: dispatch.Route{
			Name:     sc.Name,
			Sources:  []dispatch.Source{c.Source(), c.RetrySource()},
			Transfer: c,
			CESource: "/rabbitmq/" + r.Queue,
		},
		ready: func() error {
			if !c.Connected() {
				return errors.New("broker not connected")
			}
			return nil
		},
		// Run keeps the connection up and closes it when its ctx ends.
		run:   func(ctx context.Context) { _ = c.Run(ctx) },
		close: func() {},
	}
}

func kafkaSource(sc config.Source, tiers []time.Duration, journalPath string, log *slog.Logger) (source, error) {
	k := sc.Kafka
	o := kafka.Options{
		Name:           sc.Name,
		Brokers:        k.Brokers,
		Topic:          k.Topic,
		Group:          k.Group,
		Tiers:          tiers,
		Declare:        *k.Declare,
		Ordering:       k.Ordering,
		MaxInFlight:    k.MaxInFlight,
		FetchMaxBytes:  int32(k.FetchMaxBytes),
		SessionTimeout: k.SessionTimeout.D(),
		InstanceID:     k.InstanceID,
		Logger:         log,
	}
	if k.TransactionalTransfer {
		o.TransactionalID = transactionalID(sc.Name, k, journalPath)
	}
	c, err := kafka.New(o)
	if err != nil {
		return source{}, err
	}
	var declared atomic.Bool
	return source{
		route: dispatch.Route{
			Name:     sc.Name,
			Sources:  []dispatch.Source{c},
			Transfer: c,
			CESource: "/kafka/" + k.Topic,
			// Ordered modes retry where the record is: a copy in a retry
			// topic would let the records behind it overtake it.
			InPlace: k.Ordering != "none",
			// One poll loop brings records and retries: the client pauses
			// its retry topics while the budget is spent.
			RetriesShareIntake: true,
		},
		ready: func() error {
			if !declared.Load() {
				return errors.New("topics not yet checked")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := c.Ping(ctx); err != nil {
				return fmt.Errorf("no broker answers: %w", err)
			}
			return nil
		},
		// The client reconnects by itself; what must succeed once is the
		// check (and creation) of the derived topics.
		run: func(ctx context.Context) {
			backoff := 100 * time.Millisecond
			for {
				err := c.Declare(ctx)
				if err == nil {
					declared.Store(true)
					return
				}
				log.Warn("kafka topics not ready", "source", sc.Name, "err", err, "retry_in", backoff)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, 10*time.Second)
			}
		},
		close: func() {
			if err := c.Close(); err != nil {
				log.Warn("kafka close: committing offsets failed", "source", sc.Name, "err", err)
			}
		},
	}, nil
}

// transactionalID names a source's Kafka transactions. It stays the same
// across the sidecar's restarts, so a restart aborts the transaction a crash
// left open at once, and differs between the group's members, which would
// otherwise fence each other: a member is its static instance id, else its
// host name (a pod's name) and journal file (two sidecars on one host cannot
// share one).
func transactionalID(source string, k *config.Kafka, journalPath string) string {
	member := k.InstanceID
	if member == "" {
		host, _ := os.Hostname()
		if abs, err := filepath.Abs(journalPath); err == nil {
			journalPath = abs
		}
		member = host + ":" + journalPath
	}
	return "handoff/" + source + "/" + k.Group + "/" + member
}
