package config

import (
	"os"
	"path/filepath"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/journal"
)

// Config is the whole sidecar configuration file.
type Config struct {
	Handler  Handler  `yaml:"handler"`
	Sources  []Source `yaml:"sources"`
	Retry    Retry    `yaml:"retry"`
	Budget   Budget   `yaml:"budget"`
	Outcomes Outcomes `yaml:"outcomes"`
	Journal  Journal  `yaml:"journal"`
	// DeadLetter is the dead-letter destinations' own settings.
	DeadLetter DeadLetter `yaml:"deadletter"`
	Admin      Admin      `yaml:"admin"`
	Telemetry  Telemetry  `yaml:"telemetry"`
	Shutdown   Shutdown   `yaml:"shutdown"`
}

// Handler is the app's endpoint.
type Handler struct {
	// URL receives each message: http://, https:// or http+unix:// (POST),
	// grpc://, grpcs:// or grpc+unix:// (handoff.handler.v1.MessageHandler).
	URL string `yaml:"url"`
	// Timeout bounds one attempt; the deadline may shorten it.
	Timeout Duration `yaml:"timeout"`
	// MaxConcurrency bounds in-flight calls to the app, shared by all sources.
	// With batch delivery it counts messages, not requests.
	MaxConcurrency int `yaml:"max_concurrency"`
	// Batch, when MaxMessages > 1, hands messages over several to a request
	// in CloudEvents batched mode.
	Batch Batch `yaml:"batch"`
	// MaxMessageBytes bounds a message's body: a larger one is never handed
	// to the app but dead-lettered, reason too-large, with its size.
	MaxMessageBytes ByteSize `yaml:"max_message_bytes"`
}

// DefaultMaxMessageBytes is handler.max_message_bytes when it is not set;
// MaxMaxMessageBytes its largest value (RabbitMQ refuses messages over
// 512 MiB at any setting).
const (
	DefaultMaxMessageBytes = 16 << 20
	MaxMaxMessageBytes     = 512 << 20
)

// Batch is batch delivery: a request goes out with MaxMessages messages, or
// MaxWait after its first one.
type Batch struct {
	MaxMessages int      `yaml:"max_messages"`
	MaxWait     Duration `yaml:"max_wait"`
}

// Source is one broker input. Exactly one broker block is set.
type Source struct {
	Name     string    `yaml:"name"`
	RabbitMQ *RabbitMQ `yaml:"rabbitmq"`
	Kafka    *Kafka    `yaml:"kafka"`
}

// RabbitMQ is a queue consumed with manual acks.
type RabbitMQ struct {
	URL   string `yaml:"url"`
	Queue string `yaml:"queue"`
	// Prefetch bounds unacked deliveries per consumer (the source queue and
	// its retry queue each have one). Zero means four times
	// handler.max_concurrency (see prefetchPerCall).
	Prefetch int `yaml:"prefetch"`
	// DeliveryLimit is the queues' delivery limit (x-delivery-limit, by
	// argument or policy), which AMQP 0-9-1 cannot tell a consumer: after
	// that many returns a quorum queue drops a message or dead-letters it
	// by its own policy. A delivery that reached it is never handed to the
	// app; it is moved to a retry tier, or dead-lettered as delivery-limit
	// when its calls kill the sidecar. Unset means 20, RabbitMQ 4.x's
	// default for every quorum queue; 0 says the queues have none.
	DeliveryLimit *int `yaml:"delivery_limit"`
	// Declare creates the retry tiers, retry queue and dead-letter queue when
	// missing. With false they must already exist.
	Declare *bool `yaml:"declare"`
	// TLS is the CA, client certificate and server name for an amqps://
	// URL; without it an amqps:// URL trusts the system's roots.
	TLS *TLS `yaml:"tls"`
	// Credentials, when set, log in instead of the URL's user and password
	// (PLAIN), which may then come from a file or the environment.
	Credentials `yaml:",inline"`
}

// prefetchPerCall is the default prefetch a call in flight: a delivery is
// acked only once its outcome is committed to the journal, a few
// milliseconds after the app answers, and the deliveries waiting for that
// commit take room in the prefetch as the calls do. At a prefetch of
// handler.max_concurrency, half or more of it waited on commits: a drain of
// 1 KiB messages to an app that answers at once ran at half the rate it
// did at four times (8.4–10.5k against 15.0–21.9k msg/s on a 2-core
// machine; twice: 10.7–12.0k; eight times: within the noise of four). What
// it costs is memory: the deliveries the broker hands over before they are
// called (docs/configuration.md).
const prefetchPerCall = 4

// maxPrefetch is the most a channel's prefetch can be (AMQP's prefetch
// count is 16 bits).
const maxPrefetch = 65535

// DefaultPrefetch is a RabbitMQ source's prefetch when none is set, for
// handler.max_concurrency calls at once: prefetchPerCall a call, within
// AMQP's bound.
func DefaultPrefetch(maxConcurrency int) int {
	return min(prefetchPerCall*maxConcurrency, maxPrefetch)
}

// Kafka is a topic consumed by a consumer group, or by a share group.
type Kafka struct {
	Brokers []string `yaml:"brokers"`
	Topic   string   `yaml:"topic"`
	Group   string   `yaml:"group"`
	// ShareGroup, instead of Group, consumes the topic through a share
	// group (KIP-932, Kafka 4.2 and later): the brokers hand each record to
	// one member and take it back one by one, so more sidecars than
	// partitions share the topic and a failing record holds back no other.
	// Records come in no order: ordering must be none. The retry topics
	// are read by a consumer group of their own, named SHARE_GROUP.retries.
	ShareGroup string `yaml:"share_group"`
	// Ordering is none (parallel within a partition; the default), key or
	// partition.
	Ordering broker.Ordering `yaml:"ordering"`
	// Declare creates the retry and dead-letter topics when missing.
	Declare *bool `yaml:"declare"`
	// TransactionalTransfer produces a copy and commits the source offset in
	// one Kafka transaction.
	TransactionalTransfer bool `yaml:"transactional_transfer"`
	// MaxInFlight bounds records handed out and not yet answered. Zero means
	// twice handler.max_concurrency with ordering none (a call in flight and
	// one ready behind each), four times with key or partition ordering
	// (records held behind their key or partition take room); with batches
	// (handler.batch.max_messages above 1), handler.max_concurrency and one
	// batch more.
	MaxInFlight int `yaml:"max_in_flight"`
	// FetchMaxBytes bounds one fetch from the brokers, which is what the
	// sidecar buffers besides the records in flight. Zero means 8 MiB. A
	// record larger than it is still fetched, alone.
	FetchMaxBytes int `yaml:"fetch_max_bytes"`
	// SessionTimeout is how long the group waits for a member that stopped
	// heartbeating (a crashed sidecar) before its partitions move. Zero means
	// 45s, the client's default.
	SessionTimeout Duration `yaml:"session_timeout"`
	// InstanceID is the member's static group instance id (KIP-345), which
	// lets a sidecar restarted with the same id take its partitions back at
	// once instead of waiting out the session timeout. Membership is static
	// anyway: empty means an id made once per journal and kept in it; set it
	// (say, to the pod's name) to choose the id an operator sees.
	InstanceID string `yaml:"instance_id"`
	// TLS, when present, connects to the brokers over TLS.
	TLS *TLS `yaml:"tls"`
	// SASL, when present, authenticates to the brokers.
	SASL *SASL `yaml:"sasl"`
	// StartFrom is where a group that has committed nothing on a partition
	// starts: earliest (the default: every record the topic still holds)
	// or latest (only what is produced from then on).
	StartFrom string `yaml:"start_from"`
}

// GroupName is the group the source consumes in, a consumer group or a
// share group: the copies' and dead letters' topics are named after it.
func (k *Kafka) GroupName() string {
	if k.ShareGroup != "" {
		return k.ShareGroup
	}
	return k.Group
}

// Retry bounds how often and how long a message is tried.
type Retry struct {
	MaxAttempts int        `yaml:"max_attempts"`
	Base        Duration   `yaml:"base"`
	Cap         Duration   `yaml:"cap"`
	Tiers       []Duration `yaml:"tiers"`
	Deadline    Duration   `yaml:"deadline"`
	DeferMaxAge Duration   `yaml:"defer_max_age"`
	// MinAttempt is the least time left before the deadline that still
	// makes an attempt worth starting.
	MinAttempt Duration `yaml:"min_attempt"`
	// TrustProducerDeadline lets a message's handoff-deadline header shorten
	// (never extend) its deadline; otherwise producers' handoff-* headers
	// are ignored.
	TrustProducerDeadline bool `yaml:"trust_producer_deadline"`
}

// Budget is the retry budget shared by every source of the handler: each
// first attempt deposits Ratio tokens, each re-attempt takes one, plus a
// reserve of MinPerSecond tokens a second, over a sliding Window.
type Budget struct {
	Ratio        float64  `yaml:"ratio"`
	MinPerSecond float64  `yaml:"min_per_second"`
	Window       Duration `yaml:"window"`
}

// Outcomes overrides the default classification of answers.
type Outcomes struct {
	// HTTP maps a status ("404") or a class ("5xx") to an outcome name, for
	// an HTTP handler.
	HTTP map[string]string `yaml:"http"`
	// GRPC maps a status code name ("NOT_FOUND") to an outcome name, for a
	// gRPC handler.
	GRPC map[string]string `yaml:"grpc"`
}

// Journal is the hand-off journal file.
type Journal struct {
	Path string `yaml:"path"`
	// Sync is always, batch (group commit; the default) or none.
	Sync string `yaml:"sync"`
	// Retention is how long settled hand-offs are kept, and so the window in
	// which a redelivered or duplicate event is recognised.
	Retention Duration `yaml:"retention"`
	// MaxSize bounds the journal's live data (the file less its free
	// pages): once it is reached, the earliest settled hand-offs are
	// dropped, before their retention is out. Open ones never are.
	MaxSize ByteSize `yaml:"max_size"`
	// Linger is how long a group commit waits for more records once the
	// queue runs dry (sync: batch and none): under load, fewer and fuller
	// commits for at most this much more latency per hand-off. 0 commits
	// at once.
	Linger Duration `yaml:"linger"`
}

// MinJournalMaxSize is the least journal.max_size: below it a burst of
// open hand-offs alone would fill the journal.
const MinJournalMaxSize = 1 << 20

// DeadLetter configures the dead-letter destinations (RabbitMQ Q.dlq, Kafka
// T.G.dlq).
type DeadLetter struct {
	// Retention is how long a dead letter is kept in its log: the stream's
	// x-max-age on RabbitMQ, the topic's retention.ms on Kafka. It applies
	// when the sidecar creates the destination; an existing one keeps its own.
	Retention Duration `yaml:"retention"`
	// Index is the replica's index of the dead-letter logs, a bbolt file
	// rebuilt from the logs when it is missing; the journal's path with
	// ".deadletters" added when empty.
	Index string `yaml:"index"`
	// Poll is how often the index catches up with the logs: how soon a
	// dead letter, a transition made by another replica or a replayed
	// copy's failure shows here.
	Poll Duration `yaml:"poll"`
	// ReplayTakeover is how long a replay's runner may go without a
	// heartbeat before another replica takes the replay over.
	ReplayTakeover Duration `yaml:"replay_takeover"`
}

// DefaultDeadLetterRetention is deadletter.retention when it is not set.
const DefaultDeadLetterRetention = 14 * 24 * time.Hour

// Admin is the admin API: gRPC and REST/JSON on one listener.
type Admin struct {
	Listen string `yaml:"listen"`
	// TokenFile holds the bearer token every call must carry. The file must
	// not be readable by group or others. Empty turns the admin API off,
	// unless AllowAnonymousRead is set.
	TokenFile string `yaml:"token_file"`
	// AllowAnonymousRead lets the status in without a token (not an event's
	// timeline, whose evidence quotes the app). It is refused on a listener
	// that is not loopback.
	AllowAnonymousRead bool `yaml:"allow_anonymous_read"`
	// TokenName is who the dead-letter ledger records for a change made
	// with the token; a request may add an operator after it
	// ("admin/alice"). Printable, at most MaxTokenNameLen bytes.
	TokenName string `yaml:"token_name"`
	// Token is the bearer token itself, from HANDOFF_ADMIN_TOKEN (never
	// from the file): how a Kubernetes Secret reaches a sidecar that runs
	// as a user of its own, which a Secret's files, owned by root, would
	// have to be readable by others to reach. It takes the place of
	// TokenFile.
	Token string `yaml:"-"`
}

// MaxTokenNameLen bounds admin.token_name, which every ledger record of a
// change made through the admin API carries.
const MaxTokenNameLen = 64

// Telemetry is the metrics and health listener.
type Telemetry struct {
	// MetricsListen serves /healthz, /readyz and /metrics. Empty disables
	// it, and, with no OTLPEndpoint either, the metrics: nothing could
	// read them.
	MetricsListen string `yaml:"metrics_listen"`
	// OTLPEndpoint, host:port of an OTLP/gRPC collector, turns tracing on
	// (a span per attempt) and pushes the metrics there too, every
	// OTLPMetricInterval. Empty leaves tracing off.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// OTLPMetricInterval is how often the metrics are pushed to
	// OTLPEndpoint.
	OTLPMetricInterval Duration `yaml:"otlp_metric_interval"`
	// OTLPInsecure sends to the collector without TLS (a local agent).
	OTLPInsecure bool `yaml:"otlp_insecure"`
	// TraceSampleRatio is the share of traces started here that are kept;
	// a message whose producer sampled its trace (or not) is followed as
	// the producer decided (parent-based). 1 keeps every one.
	TraceSampleRatio float64 `yaml:"trace_sample_ratio"`
	// DrainWindow is the window the backlog's arrival and completion rates
	// (λ, μ) are taken over, for the drain time B/(μ−λ); the backlog is
	// read twelve times in it.
	DrainWindow Duration `yaml:"drain_window"`
}

// Shutdown bounds the drain on SIGTERM.
type Shutdown struct {
	DrainTimeout Duration `yaml:"drain_timeout"`
	// HTTPDrain serves GET /drain on telemetry.metrics_listen: it starts
	// the shutdown a SIGTERM would, and answers once intake has stopped and
	// the deliveries in flight are settled or handed back. A Kubernetes
	// preStop hook on the app's container calls it, so that the drain
	// runs while the app still answers; the process then exits.
	HTTPDrain bool `yaml:"http_drain"`
	// DrainToken, from HANDOFF_DRAIN_TOKEN (never the file, which many
	// pods share), is what GET /drain must carry as its bearer token: the
	// sidecar injector puts one random value in the preStop hook and here.
	// Without one, /drain is served only on a loopback metrics_listen.
	DrainToken string `yaml:"-"`
}

// MinDrainTokenLen bounds HANDOFF_DRAIN_TOKEN from below: a token short
// enough to guess would guard nothing.
const MinDrainTokenLen = 16

// Default returns a Config holding every default; Load decodes a file over it.
func Default() Config {
	return Config{
		Handler: Handler{Timeout: Duration(5 * time.Second), MaxConcurrency: 64,
			Batch: Batch{MaxWait: Duration(5 * time.Millisecond)}, MaxMessageBytes: DefaultMaxMessageBytes},
		Retry: Retry{
			MaxAttempts: 4,
			Base:        Duration(100 * time.Millisecond),
			Cap:         Duration(2 * time.Second),
			Tiers: []Duration{
				Duration(time.Second), Duration(10 * time.Second),
				Duration(time.Minute), Duration(10 * time.Minute),
			},
			Deadline:    Duration(time.Hour),
			DeferMaxAge: Duration(24 * time.Hour),
			MinAttempt:  Duration(100 * time.Millisecond),
		},
		Budget: Budget{Ratio: 0.2, MinPerSecond: 10, Window: Duration(10 * time.Second)},
		Journal: Journal{Path: DefaultJournalPath(), Sync: "batch", Retention: Duration(24 * time.Hour), MaxSize: ByteSize(journal.DefaultMaxSize),
			Linger: Duration(2 * time.Millisecond)},
		DeadLetter: DeadLetter{Retention: Duration(DefaultDeadLetterRetention), Poll: Duration(time.Second), ReplayTakeover: Duration(10 * time.Second)},
		Admin:      Admin{Listen: "127.0.0.1:9400", TokenName: "admin"},
		Telemetry: Telemetry{MetricsListen: "127.0.0.1:9464", TraceSampleRatio: 1,
			OTLPMetricInterval: Duration(30 * time.Second), DrainWindow: Duration(time.Minute)},
		Shutdown: Shutdown{DrainTimeout: Duration(30 * time.Second)},
	}
}

// DefaultDeliveryLimit is rabbitmq.delivery_limit when it is not set: the
// limit RabbitMQ 4.x gives every quorum queue.
const DefaultDeliveryLimit = 20

// kafka.fetch_max_bytes when it is not set, and its largest value: what the
// Kafka client reads from a broker in one response.
const (
	DefaultFetchMaxBytes = 8 << 20
	MaxFetchMaxBytes     = 100 << 20
)

// applySourceDefaults fills per-source defaults that depend on other keys.
func (c *Config) applySourceDefaults() {
	for i := range c.Sources {
		if k := c.Sources[i].Kafka; k != nil {
			if k.Ordering == "" {
				k.Ordering = broker.OrderNone
			}
			if k.Declare == nil {
				t := true
				k.Declare = &t
			}
			if k.MaxInFlight == 0 {
				k.MaxInFlight = 4 * c.Handler.MaxConcurrency
				if k.Ordering == broker.OrderNone {
					// No record waits behind another: more than a call
					// and one ready behind each would only park walks in
					// the limiter's queue.
					k.MaxInFlight = 2 * c.Handler.MaxConcurrency
				}
				if b := c.Handler.Batch.MaxMessages; b > 1 {
					// max_concurrency already counts the messages in the
					// batches in flight; one batch more fills while they
					// are. Four times it would only park walks waiting
					// for a slot: a goroutine and a delivery each.
					k.MaxInFlight = c.Handler.MaxConcurrency + b
				}
			}
			if k.FetchMaxBytes == 0 {
				k.FetchMaxBytes = DefaultFetchMaxBytes
			}
		}
		if r := c.Sources[i].RabbitMQ; r != nil {
			if r.Prefetch == 0 {
				r.Prefetch = DefaultPrefetch(c.Handler.MaxConcurrency)
			}
			if r.DeliveryLimit == nil {
				n := DefaultDeliveryLimit
				r.DeliveryLimit = &n
			}
			if r.Declare == nil {
				t := true
				r.Declare = &t
			}
		}
	}
}

// DefaultJournalPath is where the journal lives unless journal.path says:
// the user's state directory ($XDG_STATE_HOME/handoff, else
// ~/.local/state/handoff), not the directory the sidecar was started in;
// handoff.db in that directory when there is no home. A pod's sidecar is
// given a path on its volume (HANDOFF_JOURNAL_PATH).
func DefaultJournalPath() string {
	dir := os.Getenv("XDG_STATE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil || home == "" {
			return "handoff.db"
		}
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "handoff", "handoff.db")
}
