package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/journal"
)

// An unconfirmed dead-letter copy is looked for before it is written again:
// Kafka reads the topic back, RabbitMQ the dead-letter stream.
var (
	_ dispatch.CopyFinder = (*kafka.Client)(nil)
	_ dispatch.CopyFinder = (*rabbitmq.Client)(nil)

	_ dispatch.RetryHolder = (*kafka.Client)(nil)
)

func rabbitSource(sc config.Source, tiers []time.Duration, deadLetterRetention time.Duration, log *slog.Logger) (source, error) {
	r := sc.RabbitMQ
	var tlsConfig *tls.Config
	if r.TLS != nil {
		var err error
		if tlsConfig, err = clientTLS(sc.Name, r.TLS, log); err != nil {
			return source{}, err
		}
	}
	c := rabbitmq.NewClient(rabbitmq.Options{
		Name:     sc.Name,
		URL:      r.URL,
		Queue:    r.Queue,
		Prefetch: r.Prefetch,
		// Set by the defaults; nil only for a config built by hand.
		DeliveryLimit: deref(r.DeliveryLimit),
		Tiers:         tiers,
		Declare:       *r.Declare,
		// Applies when the sidecar declares the dead-letter stream.
		DeadLetterRetention: deadLetterRetention,
		Logger:              log,
		TLS:                 tlsConfig,
		Login:               rabbitLogin(r),
	})
	return source{
		name: sc.Name,
		deadLetters: deadletter.ManagedSource{
			Source:      deadletter.Source{Name: sc.Name, DLQ: c.DeadLetterLog(), Ledger: c.LedgerLog()},
			Republisher: c,
		},
		route: dispatch.Route{
			Name:        sc.Name,
			System:      "rabbitmq",
			Destination: r.Queue,
			Sources:     []dispatch.Source{c.Source(), c.RetrySource()},
			Transfer:    c,
			CESource:    "/rabbitmq/" + r.Queue,
		},
		ready: func() error {
			if !c.Connected() {
				if err := c.LastError(); err != nil {
					if why, ok := rabbitmq.Refusal(err); ok {
						return fmt.Errorf("broker not connected: refused: %s", why)
					}
					return fmt.Errorf("broker not connected: %w", err)
				}
				return errors.New("broker not connected")
			}
			return nil
		},
		// Run keeps the connection up and closes it when its ctx ends.
		run:     c.Run,
		close:   func() {},
		waiting: rabbitWaiting(c),
		backlog: func(ctx context.Context) (int64, int64, bool, error) {
			b, err := c.Backlog(ctx)
			return b, 0, false, err
		},
	}, nil
}

// kafkaSource builds a Kafka source; the journal's instance id is what the
// source's group membership and transactions are built on, and the journal
// keeps its partitions' handed-out marks.
func kafkaSource(sc config.Source, tiers []time.Duration, deadLetterRetention time.Duration, maxMessageBytes int, jr *journal.Journal, log *slog.Logger) (source, error) {
	k := sc.Kafka
	member := groupInstanceID(sc.Name, k, jr.InstanceID())
	security, err := kafkaSecurity(sc.Name, k, log)
	if err != nil {
		return source{}, err
	}
	o := kafka.Options{
		Name:    sc.Name,
		Brokers: k.Brokers,
		Topic:   k.Topic,
		Group:   k.Group,
		Tiers:   tiers,
		Declare: *k.Declare,
		// Applies when the sidecar creates the dead-letter topic.
		DeadLetterRetention: deadLetterRetention,
		Ordering:            k.Ordering,
		MaxInFlight:         k.MaxInFlight,
		FetchMaxBytes:       int32(k.FetchMaxBytes),
		SessionTimeout:      k.SessionTimeout.D(),
		InstanceID:          member,
		MaxMessageBytes:     maxMessageBytes,
		Extra:               security,
		Marks:               jr,
		Logger:              log,
	}
	if k.TransactionalTransfer {
		o.TransactionalID = transactionalID(sc.Name, k.Group, member)
	}
	log.Info("kafka group member", "source", sc.Name, "group", k.Group, "instance_id", member, "transactional_id", o.TransactionalID)
	c, err := kafka.New(o)
	if err != nil {
		return source{}, err
	}
	ledger, err := c.LedgerLog()
	if err != nil {
		_ = c.Close()
		return source{}, err
	}
	var (
		declared    atomic.Bool
		declareFail atomic.Pointer[string] // why the latest check failed
	)
	return source{
		name: sc.Name,
		deadLetters: deadletter.ManagedSource{
			Source:      deadletter.Source{Name: sc.Name, DLQ: c.DeadLetterLog(), Ledger: ledger},
			Republisher: c,
		},
		route: dispatch.Route{
			Name:        sc.Name,
			System:      "kafka",
			Destination: k.Topic,
			Sources:     []dispatch.Source{c},
			Transfer:    c,
			CESource:    "/kafka/" + k.Topic,
			// Ordered modes retry where the record is: a copy in a retry
			// topic would let the records behind it overtake it.
			InPlace: k.Ordering.InPlace(),
			// One poll loop brings records and retries: the client pauses
			// its retry topics while the budget is spent.
			RetriesShareIntake: true,
		},
		ready: func() error {
			if !declared.Load() {
				if why := declareFail.Load(); why != nil {
					return fmt.Errorf("topics not yet checked: %s", *why)
				}
				return errors.New("topics not yet checked")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := c.Ping(ctx); err != nil {
				if why, ok := kafka.Refusal(err); ok {
					return fmt.Errorf("refused: %s: %w", why, err)
				}
				return fmt.Errorf("no broker answers: %w", err)
			}
			return nil
		},
		// The client reconnects by itself; what must succeed once is the
		// check (and creation) of the derived topics.
		run: func(ctx context.Context) error {
			backoff := 100 * time.Millisecond
			for {
				err := c.Declare(ctx)
				if err == nil {
					declared.Store(true)
					return nil
				}
				msg := err.Error()
				if why, ok := kafka.Refusal(err); ok {
					msg = "refused: " + why + ": " + msg
					log.Error("kafka refused the sidecar: "+why, "source", sc.Name, "err", err, "retry_in", backoff)
				} else {
					log.Warn("kafka topics not ready", "source", sc.Name, "err", err, "retry_in", backoff)
				}
				declareFail.Store(&msg)
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, 10*time.Second)
			}
		},
		close: func() {
			ledger.Close()
			if err := c.Close(); err != nil {
				log.Warn("kafka close: committing offsets failed", "source", sc.Name, "err", err)
			}
		},
		waiting: kafkaWaiting(c),
		backlog: func(ctx context.Context) (int64, int64, bool, error) {
			lag, produced, err := c.Backlog(ctx)
			return lag, produced, true, err
		},
	}, nil
}

// groupInstanceID is the source's static member id in its consumer group
// (KIP-345): the configured instance_id, else one made from the journal's
// instance id and the source's name. A restart on the same journal is the
// same member, so it takes its partitions back at once instead of leaving
// them idle until the crashed member's session times out; two sidecars never
// share a journal, and one sidecar's sources differ by name, so no two
// members share an id. Kafka allows letters, digits, '.', '_' and '-' in it.
func groupInstanceID(source string, k *config.Kafka, journalID string) string {
	if k.InstanceID != "" {
		return k.InstanceID
	}
	return "handoff-" + journalID + "-" + legalName(source)
}

// maxNameInID bounds the source's part of a made instance id: Kafka allows
// 249 characters in all.
const maxNameInID = 160

// legalName is name with every character that an instance id may not hold
// replaced by '_', and cut to maxNameInID; a name changed so is followed by
// a hash of the original, so that two names never end up the same.
func legalName(name string) string {
	b := []byte(name)
	changed := false
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '_'
			changed = true
		}
	}
	if len(b) > maxNameInID {
		b = b[:maxNameInID]
		changed = true
	}
	if !changed {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return string(b) + "-" + hex.EncodeToString(sum[:4])
}

// transactionalID names a source's Kafka transactions after its group member:
// it stays the same across the sidecar's restarts, so a restart aborts the
// transaction a crash left open at once (rather than after the transaction
// timeout), and differs between the group's members, which would otherwise
// fence each other.
func transactionalID(source, group, member string) string {
	return "handoff/" + source + "/" + group + "/" + member
}

// deref is *p, or 0 for nil.
func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
