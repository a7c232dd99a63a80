package config

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/redact"
)

// maxQueueName is RabbitMQ's limit on a queue name, in bytes.
const maxQueueName = 255

// Validate reports every problem in c, each with its YAML path.
func (c *Config) Validate() error {
	var ps Problems
	c.Handler.validate(&ps)
	if len(c.Sources) == 0 {
		ps.add("sources", "at least one source is required")
	}
	names := map[string]int{}
	members := map[string]int{} // group and static instance id → source
	for i, s := range c.Sources {
		path := fmt.Sprintf("sources[%d]", i)
		if s.Name == "" {
			ps.add(path+".name", "required")
		} else if j, dup := names[s.Name]; dup {
			ps.add(path+".name", "duplicate source name %q (also sources[%d])", s.Name, j)
		} else {
			names[s.Name] = i
		}
		switch {
		case s.RabbitMQ != nil && s.Kafka != nil:
			ps.add(path, "exactly one broker per source: set rabbitmq or kafka, not both")
		case s.RabbitMQ != nil:
			s.RabbitMQ.validate(path+".rabbitmq", c.Retry.Tiers, &ps)
		case s.Kafka != nil:
			s.Kafka.validate(path+".kafka", &ps)
			if id := s.Kafka.InstanceID; id != "" {
				// Two members of one group with one static id fence each
				// other: each join throws the other out.
				member := s.Kafka.Group + "\x00" + id
				if j, dup := members[member]; dup {
					ps.add(path+".kafka.instance_id", "%q is also sources[%d]'s in group %q: each source needs its own", id, j, s.Kafka.Group)
				} else {
					members[member] = i
				}
			}
		default:
			ps.add(path, "exactly one broker per source: set rabbitmq or kafka")
		}
	}
	c.Retry.validate(&ps)
	c.Budget.validate(&ps)
	c.validateOutcomesGRPC(&ps)
	for key, val := range c.Outcomes.HTTP {
		path := "outcomes.http." + key
		if !validStatusKey(key) {
			ps.add(path, "want an HTTP status (100-599) or a class such as 5xx")
		}
		if _, ok := budget.ParseOutcome(val); !ok {
			ps.add(path, "unknown outcome %q (want success, retry, overload, unknown, defer, permanent, dead-letter or drop)", val)
		}
	}
	if c.Journal.Path == "" {
		ps.add("journal.path", "required")
	}
	if _, err := c.Journal.SyncMode(); err != nil {
		ps.add("journal.sync", "want always, batch or none, got %q", c.Journal.Sync)
	}
	if c.Journal.Retention <= 0 {
		ps.add("journal.retention", "must be positive")
	}
	if c.Journal.Linger < 0 || c.Journal.Linger > Duration(10*time.Millisecond) {
		ps.add("journal.linger", "must be between 0 and 10ms, got %v", c.Journal.Linger)
	}
	if c.Journal.MaxSize < MinJournalMaxSize {
		ps.add("journal.max_size", "want at least %v, got %v", ByteSize(MinJournalMaxSize), c.Journal.MaxSize)
	}
	if c.DeadLetter.Retention <= 0 {
		ps.add("deadletter.retention", "must be positive")
	}
	if c.DeadLetter.Poll < Duration(10*time.Millisecond) || c.DeadLetter.Poll > Duration(time.Minute) {
		ps.add("deadletter.poll", "must be between 10ms and 1m")
	}
	if c.DeadLetter.ReplayTakeover < Duration(time.Second) {
		ps.add("deadletter.replay_takeover", "must be at least 1s")
	}
	c.Admin.validate(&ps)
	validateListen("telemetry.metrics_listen", c.Telemetry.MetricsListen, true, &ps)
	if c.Telemetry.OTLPEndpoint != "" {
		validateListen("telemetry.otlp_endpoint", c.Telemetry.OTLPEndpoint, false, &ps)
	}
	if !(c.Telemetry.TraceSampleRatio >= 0 && c.Telemetry.TraceSampleRatio <= 1) {
		ps.add("telemetry.trace_sample_ratio", "want a share from 0 to 1, got %v", c.Telemetry.TraceSampleRatio)
	}
	if c.Telemetry.OTLPMetricInterval < Duration(time.Second) {
		ps.add("telemetry.otlp_metric_interval", "must be at least 1s")
	}
	if c.Telemetry.DrainWindow < Duration(time.Second) || c.Telemetry.DrainWindow > Duration(time.Hour) {
		ps.add("telemetry.drain_window", "must be between 1s and 1h")
	}
	if c.Shutdown.HTTPDrain && c.Telemetry.MetricsListen == "" {
		ps.add("shutdown.http_drain", "needs telemetry.metrics_listen, where /drain is served")
	}
	// /drain stops the sidecar for whoever calls it: on an address other
	// hosts reach, only a caller that holds the token may.
	if c.Shutdown.HTTPDrain && c.Shutdown.DrainToken == "" && c.Telemetry.MetricsListen != "" && !LoopbackAddr(c.Telemetry.MetricsListen) {
		ps.add("shutdown.http_drain", "telemetry.metrics_listen %q is reachable from other hosts, and /drain would stop the sidecar for any of them: set HANDOFF_DRAIN_TOKEN (the sidecar injector does), or listen on loopback", c.Telemetry.MetricsListen)
	}
	if t := c.Shutdown.DrainToken; t != "" && (len(t) < MinDrainTokenLen || !redact.Printable(t) || strings.ContainsRune(t, ' ')) {
		ps.add("shutdown.drain_token", "want at least %d bytes of printable text without spaces (a header value), got %d bytes", MinDrainTokenLen, len(t))
	}
	if c.Shutdown.DrainTimeout < 0 {
		ps.add("shutdown.drain_timeout", "must not be negative")
	}
	return ps.err()
}

func (h *Handler) validate(ps *Problems) {
	if _, err := url.Parse(h.URL); h.URL == "" {
		ps.add("handler.url", "required")
	} else if !strings.Contains(h.URL, "://") {
		// 127.0.0.1:8080/events: net/url's words for it ("first path
		// segment in URL cannot contain colon") say nothing of the fix.
		ps.add("handler.url", "want http://host:port/path (or https://, http+unix://, grpc://host:port), got %q", redact.URL(h.URL))
	} else if err != nil {
		ps.add("handler.url", "%s", notAURL(h.URL, err))
	} else if _, err := handler.ParseURL(h.URL); err != nil {
		ps.add("handler.url", "%v", err)
	}
	if h.Timeout <= 0 {
		ps.add("handler.timeout", "must be positive")
	}
	if h.MaxConcurrency < 1 {
		ps.add("handler.max_concurrency", "must be at least 1")
	}
	if h.MaxMessageBytes < 1 || h.MaxMessageBytes > MaxMaxMessageBytes {
		ps.add("handler.max_message_bytes", "want a size from 1B to 512MiB, got %v", h.MaxMessageBytes)
	}
	switch b := h.Batch; {
	case b.MaxMessages < 0 || b.MaxMessages > 10000:
		ps.add("handler.batch.max_messages", "must be between 0 (off) and 10000, got %d", b.MaxMessages)
	case b.MaxMessages > 1 && b.MaxWait <= 0:
		ps.add("handler.batch.max_wait", "must be positive")
	case b.MaxMessages > 1 && h.MaxConcurrency > 0 && b.MaxMessages > h.MaxConcurrency:
		ps.add("handler.batch.max_messages", "%d is more than handler.max_concurrency (%d), which counts messages in flight: a batch could never fill",
			b.MaxMessages, h.MaxConcurrency)
	}
}

func (r *RabbitMQ) validate(path string, tiers []Duration, ps *Problems) {
	u, err := url.Parse(r.URL)
	switch {
	case r.URL == "":
		ps.add(path+".url", "required")
	case err != nil:
		ps.add(path+".url", "%s", notAURL(r.URL, err))
	case u.Scheme != "amqp" && u.Scheme != "amqps":
		ps.add(path+".url", "scheme %q not supported; use amqp:// or amqps://", u.Scheme)
	}
	if r.URL == "" || err != nil {
		u = nil
	}
	r.validateSecurity(path, u, ps)
	if r.Queue == "" {
		ps.add(path+".queue", "required")
	} else {
		// The longest derived name: the largest tier's queue, or the lock
		// of a dead-letter queue's move into a stream.
		longest := r.Queue + ".retry." + broker.TierName(longestTier(tiers))
		if lock := r.Queue + ".dlq.migrating.lock"; len(lock) > len(longest) {
			longest = lock
		}
		if len(longest) > maxQueueName {
			ps.add(path+".queue", "too long: derived queue %q passes RabbitMQ's %d-byte limit", longest, maxQueueName)
		}
	}
	if r.Prefetch < 0 || r.Prefetch > 65535 {
		ps.add(path+".prefetch", "must be between 0 and 65535")
	}
	if r.DeliveryLimit != nil && *r.DeliveryLimit < 0 {
		ps.add(path+".delivery_limit", "want the queues' x-delivery-limit (1 or more), or 0 when they have none")
	}
}

// maxKafkaTopicName is the longest topic name Kafka accepts.
const maxKafkaTopicName = 249

func (k *Kafka) validate(path string, ps *Problems) {
	if len(k.Brokers) == 0 {
		ps.add(path+".brokers", "at least one broker (host:port) is required")
	}
	for i, b := range k.Brokers {
		validateListen(fmt.Sprintf("%s.brokers[%d]", path, i), b, false, ps)
	}
	if k.Topic == "" {
		ps.add(path+".topic", "required")
	}
	groupKey := ".group"
	switch {
	case k.Group == "" && k.ShareGroup == "":
		ps.add(path+".group", "required (or share_group, for a share group)")
	case k.Group != "" && k.ShareGroup != "":
		ps.add(path+".share_group", "set group (a consumer group) or share_group (a share group), not both")
	case k.ShareGroup != "":
		groupKey = ".share_group"
		k.validateShare(path, ps)
	}
	// The longest name derived from them is the dead-letter ledger's,
	// T.G.dlq.ledger; Kafka refuses a topic name over 249 characters.
	if g := k.GroupName(); k.Topic != "" && g != "" {
		if n := len(k.Topic) + 1 + len(g) + len(".dlq.ledger"); n > maxKafkaTopicName {
			ps.add(path+groupKey, "the dead-letter ledger's topic %s.%s.dlq.ledger would be %d characters; Kafka allows %d: shorten the topic or the group",
				k.Topic, g, n, maxKafkaTopicName)
		}
	}
	if k.Ordering != "" && !k.Ordering.Valid() {
		ps.add(path+".ordering", "want none, key or partition, got %q", k.Ordering)
	}
	switch k.StartFrom {
	case "", "earliest":
	case "latest":
		if k.TransactionalTransfer {
			ps.add(path+".start_from", "latest needs the end it starts from committed before the first record, and a transactional member commits only with a copy: use earliest with transactional_transfer")
		}
	default:
		ps.add(path+".start_from", "want earliest or latest, got %q", k.StartFrom)
	}
	if k.MaxInFlight < 0 {
		ps.add(path+".max_in_flight", "must not be negative")
	}
	if k.FetchMaxBytes < 0 || k.FetchMaxBytes > MaxFetchMaxBytes {
		ps.add(path+".fetch_max_bytes", "want a number of bytes up to %d (100 MiB; 0 means 8 MiB), got %d", MaxFetchMaxBytes, k.FetchMaxBytes)
	}
	if k.SessionTimeout < 0 {
		ps.add(path+".session_timeout", "must not be negative")
	}
	if id := k.InstanceID; id != "" && !validInstanceID(id) {
		ps.add(path+".instance_id", "want up to 249 of a-z, A-Z, 0-9, '.', '_' and '-' (what Kafka accepts), got %q", id)
	}
	if k.TLS != nil {
		k.TLS.validate(path+".tls", ps)
	}
	if k.SASL != nil {
		k.SASL.validate(path+".sasl", ps)
	}
}

// validateShare checks what a share group cannot do.
func (k *Kafka) validateShare(path string, ps *Problems) {
	if k.Ordering != "" && k.Ordering != broker.OrderNone {
		ps.add(path+".ordering", "a share group hands a partition's records to several members at once, in no order: want none with share_group (key or partition ordering needs group), got %q", k.Ordering)
	}
	if k.TransactionalTransfer {
		ps.add(path+".transactional_transfer", "a share group's acknowledgements cannot be part of a Kafka transaction: turn it off with share_group (the journal keeps the copy and its record's settle apart across a crash)")
	}
	if k.InstanceID != "" {
		ps.add(path+".instance_id", "a share group has no static members (a stopped member's records go back to the group at once), and the consumer group that reads its retry topics takes an id made from the journal: remove it with share_group")
	}
	if k.SessionTimeout != 0 {
		ps.add(path+".session_timeout", "a share group's session timeout is the brokers' (group.share.session.timeout.ms): remove it with share_group")
	}
}

// validInstanceID reports whether Kafka takes id as a group.instance.id.
func validInstanceID(id string) bool {
	if len(id) > 249 {
		return false
	}
	for _, c := range []byte(id) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (r *Retry) validate(ps *Problems) {
	if r.MaxAttempts < 1 {
		ps.add("retry.max_attempts", "must be at least 1 (it counts all attempts, including the first)")
	}
	if r.Base <= 0 {
		ps.add("retry.base", "must be positive")
	}
	if r.Cap < r.Base {
		ps.add("retry.cap", "must be at least retry.base (%s)", r.Base.D())
	}
	if len(r.Tiers) == 0 {
		ps.add("retry.tiers", "at least one delay tier is required")
	}
	for i, t := range r.Tiers {
		path := fmt.Sprintf("retry.tiers[%d]", i)
		switch {
		case t < Duration(time.Millisecond):
			ps.add(path, "must be at least 1ms")
		case t.D()%time.Millisecond != 0:
			ps.add(path, "must be a whole number of milliseconds (RabbitMQ's x-message-ttl)")
		case i > 0 && t <= r.Tiers[i-1]:
			ps.add(path, "tiers must be strictly ascending: %s is not after %s", t.D(), r.Tiers[i-1].D())
		}
	}
	if r.Deadline <= 0 {
		ps.add("retry.deadline", "must be positive")
	}
	if r.DeferMaxAge <= 0 {
		ps.add("retry.defer_max_age", "must be positive")
	}
	if r.MinAttempt <= 0 {
		ps.add("retry.min_attempt", "must be positive")
	} else if r.Deadline > 0 && r.MinAttempt >= r.Deadline {
		ps.add("retry.min_attempt", "must be shorter than retry.deadline (%s)", r.Deadline.D())
	}
}

func (b *Budget) validate(ps *Problems) {
	if math.IsNaN(b.Ratio) || b.Ratio < 0 || b.Ratio > 1 {
		ps.add("budget.ratio", "must be between 0 and 1 (the share of fresh traffic retries may add), got %v", b.Ratio)
	}
	if math.IsNaN(b.MinPerSecond) || math.IsInf(b.MinPerSecond, 0) || b.MinPerSecond < 0 {
		ps.add("budget.min_per_second", "must not be negative, got %v", b.MinPerSecond)
	}
	if b.Window < Duration(time.Second) {
		ps.add("budget.window", "must be at least 1s")
	}
}

func validStatusKey(k string) bool {
	if len(k) != 3 {
		return false
	}
	if k[1:] == "xx" {
		return k[0] >= '1' && k[0] <= '5'
	}
	n, err := strconv.Atoi(k)
	return err == nil && n >= 100 && n <= 599
}

func validateListen(path, addr string, optional bool, ps *Problems) {
	if addr == "" {
		if !optional {
			ps.add(path, "required (host:port; port 0 picks a free port)")
		}
		return
	}
	// An address with a user or password in it is refused without echoing
	// the password; without the '@' check, "user:pass@host" would split
	// into a host and a bad port "pass@host".
	_, port, err := net.SplitHostPort(addr)
	if err != nil || strings.Contains(addr, "@") {
		ps.add(path, "want host:port, got %q", redact.URL(addr))
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		ps.add(path, "bad port %q", port)
	}
}

// notAURL explains why raw does not parse without echoing its password.
// net/url's reason quotes the piece it could not read (an "invalid port"
// that is the start of a password with a '/' or '#' in it), so a URL with a
// secret is shown redacted and without it.
func notAURL(raw string, err error) string {
	if red := redact.URL(raw); red != raw {
		return fmt.Sprintf("not a URL: %q (a user or password holding any of : / ? # @ %% or a space must be percent-encoded)", red)
	}
	return "not a URL: " + err.Error()
}

func longestTier(tiers []Duration) time.Duration {
	var m time.Duration
	for _, t := range tiers {
		m = max(m, t.D())
	}
	return m
}
