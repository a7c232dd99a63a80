package sidecar

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"handoff.dev/handoff/internal/admin"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/telemetry"
)

// source is one configured source, built by its broker's adapter from its
// config block: its route into the engine, how the admin API shows it, its
// backlog reading, its dead-letter logs, what runs while it is up (returning
// nil once ctx ends it, or once its work is done), and what closes it once
// every part has stopped.
type source struct {
	name  string
	route dispatch.Route
	// status is how the admin API shows the source (readiness, tiers and
	// the copies waiting in them); its backlog estimate is added once the
	// sampler is made.
	status admin.Source
	// backlog reads the source's backlog and, where the broker says, the
	// count of messages ever produced to it (for the drain estimate).
	backlog telemetry.Backlog
	// deadLetters are the source's dead-letter logs, and where a replay
	// republishes.
	deadLetters deadletter.ManagedSource
	run         func(ctx context.Context) error
	close       func()
}

// sourceNeeds is what a source is built with besides its config block.
type sourceNeeds struct {
	// tiers are the retry tiers' delays.
	tiers []time.Duration
	// deadLetterRetention applies to the dead-letter destinations the
	// sidecar creates.
	deadLetterRetention time.Duration
	// maxMessageBytes sizes Kafka's copies.
	maxMessageBytes int
	// maxConcurrency is handler.max_concurrency, which a RabbitMQ
	// prefetch below it cannot use.
	maxConcurrency int
	// journal keeps Kafka's handed-out marks, and its instance id names
	// the group members.
	journal *journal.Journal
	log     *slog.Logger
}

// buildSource builds sc with its broker's adapter.
func buildSource(sc config.Source, n sourceNeeds) (source, error) {
	switch {
	case sc.RabbitMQ != nil:
		return rabbitSource(sc.Name, sc.RabbitMQ, n)
	case sc.Kafka != nil:
		return kafkaSource(sc.Name, sc.Kafka, n)
	}
	return source{}, configError(fmt.Errorf("source %q: no broker configured", sc.Name))
}

// clientTLS builds a source's TLS configuration, saying so when it checks
// nothing.
func clientTLS(source string, t *config.TLS, log *slog.Logger) (*tls.Config, error) {
	c, err := t.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("source %s: tls: %w", source, err)
	}
	if t.InsecureSkipVerify {
		log.Warn("tls.insecure_skip_verify is set: any certificate the brokers show is accepted", "source", source)
	}
	return c, nil
}

// deref is *p, or 0 for nil.
func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
