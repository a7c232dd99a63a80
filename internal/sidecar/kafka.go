package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"handoff.dev/handoff/internal/admin"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/dispatch"
)

// An unconfirmed dead-letter copy is looked for by reading the topic back;
// the retries come through the same poll loop as fresh records.
var (
	_ dispatch.CopyFinder  = (*kafka.Client)(nil)
	_ dispatch.RetryHolder = (*kafka.Client)(nil)
)

// kafkaSource builds a Kafka source; the journal's instance id is what the
// source's group membership and transactions are built on, and the journal
// keeps its partitions' handed-out marks.
func kafkaSource(name string, k *config.Kafka, n sourceNeeds) (source, error) {
	share := k.ShareGroup != ""
	// A share group has no static members; the consumer group that reads
	// its retry topics does, so that a restart takes their partitions back
	// at once rather than after a killed member's session times out.
	member := groupInstanceID(name, k, n.journal.InstanceID())
	security, err := kafkaSecurity(name, k, n.log)
	if err != nil {
		return source{}, err
	}
	o := kafka.Options{
		Name:    name,
		Brokers: k.Brokers,
		Topic:   k.Topic,
		Group:   k.GroupName(),
		Share:   share,
		Tiers:   n.tiers,
		Declare: k.Declare == nil || *k.Declare,
		// Applies when the sidecar creates the dead-letter topic.
		DeadLetterRetention: n.deadLetterRetention,
		Ordering:            k.Ordering,
		MaxInFlight:         k.MaxInFlight,
		FetchMaxBytes:       int32(k.FetchMaxBytes),
		SessionTimeout:      k.SessionTimeout.D(),
		InstanceID:          member,
		MaxMessageBytes:     n.maxMessageBytes,
		Extra:               security,
		Marks:               n.journal,
		StartAtEnd:          k.StartFrom == "latest",
		Logger:              n.log,
	}
	if k.TransactionalTransfer {
		o.TransactionalID = transactionalID(name, k.Group, member)
	}
	if share {
		n.log.Info("kafka share group member", "source", name, "share_group", k.ShareGroup, "retry_group", kafka.ShareRetryGroup(k.ShareGroup), "retry_instance_id", member)
	} else {
		n.log.Info("kafka group member", "source", name, "group", k.Group, "instance_id", member, "transactional_id", o.TransactionalID)
	}
	c, err := kafka.New(o)
	if err != nil {
		return source{}, err
	}
	// One poll loop brings records and retries, and pauses its retry
	// topics while the budget is spent; a share group's records come
	// through a loop of their own, and its copies wait for their tokens
	// as they are taken.
	sources := []dispatch.Source{c}
	if share {
		sources = []dispatch.Source{c.ShareSource(), c}
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
	status := admin.Source{Name: name, Broker: "kafka", From: k.Topic,
		Ready: func() error {
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
		// The group's lag on each retry topic.
		Waiting: func(ctx context.Context) ([]int64, error) {
			ls, err := c.RetryLag(ctx)
			if err != nil {
				return nil, err
			}
			out := make([]int64, len(ls))
			for i, l := range ls {
				out[i] = l.Lag
			}
			return out, nil
		},
	}
	if share {
		ss := c.ShareSource()
		status.Share = func() admin.ShareGroup {
			limit, lock := ss.Limits()
			return admin.ShareGroup{Name: k.ShareGroup, RetryGroup: kafka.ShareRetryGroup(k.ShareGroup), Limit: limit, Lock: lock, ReadFrom: ss.LimitsRead()}
		}
	}
	if !k.Ordering.InPlace() { // ordered modes have no retry topics
		for _, t := range n.tiers {
			status.Tiers = append(status.Tiers, admin.Tier{Name: kafka.RetryTopic(k.Topic, k.GroupName(), t), Delay: t})
		}
	}
	return source{
		name: name,
		route: dispatch.Route{
			Name:        name,
			System:      "kafka",
			Destination: k.Topic,
			Sources:     sources,
			Transfer:    c,
			CESource:    "/kafka/" + k.Topic,
			// Ordered modes retry where the record is: a copy in a retry
			// topic would let the records behind it overtake it.
			InPlace:            k.Ordering.InPlace(),
			RetriesShareIntake: !share,
		},
		status: status,
		backlog: func(ctx context.Context) (int64, int64, bool, error) {
			lag, produced, err := c.Backlog(ctx)
			return lag, produced, true, err
		},
		deadLetters: deadletter.ManagedSource{
			Source:      deadletter.Source{Name: name, DLQ: c.DeadLetterLog(), Ledger: ledger},
			Republisher: c,
		},
		// The client reconnects by itself; what must succeed once is the
		// check (and creation) of the derived topics.
		run: func(ctx context.Context) error {
			return retry(ctx, 100*time.Millisecond, 10*time.Second, func(backoff time.Duration) bool {
				err := c.Declare(ctx)
				if err == nil {
					declared.Store(true)
					return true
				}
				msg := err.Error()
				if why, ok := kafka.Refusal(err); ok {
					msg = "refused: " + why + ": " + msg
					n.log.Error("kafka refused the sidecar: "+why, "source", name, "err", err, "retry_in", backoff)
				} else {
					n.log.Warn("kafka topics not ready", "source", name, "err", err, "retry_in", backoff)
				}
				declareFail.Store(&msg)
				return false
			})
		},
		close: func() {
			ledger.Close()
			if err := c.Close(); err != nil {
				n.log.Warn("kafka close: committing offsets failed", "source", name, "err", err)
			}
		},
	}, nil
}

// retry calls try until it reports done or ctx ends, waiting between tries
// from first, doubled each time up to most; try is told the wait that
// follows a failure. It returns nil either way: a source that stops trying
// because the sidecar stops has not failed.
func retry(ctx context.Context, first, most time.Duration, try func(next time.Duration) bool) error {
	backoff := budget.NewBackoff(first, most)
	for !try(backoff.Peek()) {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff.Next()):
		}
	}
	return nil
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

// kafkaSecurity is the client options for a Kafka source's TLS and SASL.
// SASL credentials are read at each new connection, so a rotated password
// file is taken up without a restart.
func kafkaSecurity(source string, k *config.Kafka, log *slog.Logger) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if k.TLS != nil {
		c, err := clientTLS(source, k.TLS, log)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(c))
	}
	s := k.SASL
	if s == nil {
		return opts, nil
	}
	if k.TLS == nil {
		log.Warn("kafka sasl without tls: the exchange, and with PLAIN the password, cross the network in clear", "source", source, "mechanism", s.Mechanism)
	}
	creds := s.Credentials
	login := func() (string, string, error) {
		user, err := creds.User()
		if err != nil {
			return "", "", fmt.Errorf("source %s: sasl: %w", source, err)
		}
		password, err := creds.Secret()
		if err != nil {
			return "", "", fmt.Errorf("source %s: sasl: %w", source, err)
		}
		return user, password, nil
	}
	var m sasl.Mechanism
	switch s.Mechanism {
	case config.SASLPlain:
		m = plain.Plain(func(context.Context) (plain.Auth, error) {
			user, password, err := login()
			return plain.Auth{User: user, Pass: password}, err
		})
	case config.SASLScramSHA256, config.SASLScramSHA512:
		auth := func(context.Context) (scram.Auth, error) {
			user, password, err := login()
			return scram.Auth{User: user, Pass: password}, err
		}
		if s.Mechanism == config.SASLScramSHA256 {
			m = scram.Sha256(auth)
		} else {
			m = scram.Sha512(auth)
		}
	default:
		return nil, fmt.Errorf("source %s: sasl.mechanism %q not supported", source, s.Mechanism)
	}
	return append(opts, kgo.SASL(m)), nil
}
