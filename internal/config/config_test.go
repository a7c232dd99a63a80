package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const validYAML = `
handler:
  url: http://127.0.0.1:8080/events
  timeout: 5s
  max_concurrency: 64
sources:
  - name: orders
    rabbitmq:
      url: amqp://guest:guest@127.0.0.1:5672/
      queue: orders
      prefetch: 100
retry:
  max_attempts: 4
  base: 100ms
  cap: 2s
  tiers: [1s, 10s, 1m, 10m]
  deadline: 1h
  defer_max_age: 24h
outcomes:
  http: {"404": permanent}
journal:   {path: ./handoff.db}
admin:     {listen: 127.0.0.1:9400}
telemetry: {metrics_listen: 127.0.0.1:9464}
shutdown:  {drain_timeout: 30s}
`

func TestParseValid(t *testing.T) {
	cfg, err := Parse([]byte(validYAML))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got := cfg.Sources[0].RabbitMQ.Prefetch; got != 100 {
		t.Errorf("prefetch = %d, want 100", got)
	}
	if got := cfg.Retry.Tiers; len(got) != 4 || got[2].D() != time.Minute {
		t.Errorf("tiers = %v, want [1s 10s 1m 10m]", got)
	}
	if !*cfg.Sources[0].RabbitMQ.Declare {
		t.Error("declare should default to true")
	}
	if cfg.Outcomes.HTTP["404"] != "permanent" {
		t.Errorf("outcomes.http = %v", cfg.Outcomes.HTTP)
	}
	if got := cfg.DeadLetter.Retention.D(); got != 336*time.Hour {
		t.Errorf("deadletter.retention = %v, want the default 336h", got)
	}
}

func TestParseDefaults(t *testing.T) {
	cfg, err := Parse([]byte(`
handler: {url: "http://127.0.0.1:8080/events", max_concurrency: 8}
sources: [{name: a, rabbitmq: {url: "amqp://localhost/", queue: a}}, {name: b, kafka: {brokers: ["127.0.0.1:9092"], topic: t, group: g}}]
retry: {tiers: [2s]}
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if cfg.Handler.Timeout.D() != 5*time.Second || cfg.Retry.MaxAttempts != 4 || cfg.Shutdown.DrainTimeout.D() != 30*time.Second {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if got := cfg.Sources[0].RabbitMQ.Prefetch; got != 32 {
		t.Errorf("prefetch default = %d, want four times handler.max_concurrency (32)", got)
	}
	if k := cfg.Sources[1].Kafka; k.MaxInFlight != 16 || k.FetchMaxBytes != 8<<20 {
		t.Errorf("kafka defaults: max_in_flight %d, fetch_max_bytes %d; want 16 (ordering none) and 8 MiB", k.MaxInFlight, k.FetchMaxBytes)
	}
	keyed, err := Parse([]byte(`
handler: {url: "http://127.0.0.1:8080/events", max_concurrency: 8}
sources: [{name: b, kafka: {brokers: ["127.0.0.1:9092"], topic: t, group: g, ordering: key}}]
retry: {tiers: [2s]}
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got := keyed.Sources[0].Kafka.MaxInFlight; got != 32 {
		t.Errorf("kafka max_in_flight ordered by key = %d, want four times max_concurrency (32)", got)
	}
	batched, err := Parse([]byte(`
handler: {url: "http://127.0.0.1:8080/events", max_concurrency: 256, batch: {max_messages: 64}}
sources: [{name: b, kafka: {brokers: ["127.0.0.1:9092"], topic: t, group: g}}]
retry: {tiers: [2s]}
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got := batched.Sources[0].Kafka.MaxInFlight; got != 256+64 {
		t.Errorf("kafka max_in_flight with batches = %d, want max_concurrency and one batch (320)", got)
	}
	if b := cfg.Budget; b.Ratio != 0.2 || b.MinPerSecond != 10 || b.Window.D() != 10*time.Second || cfg.Retry.TrustProducerDeadline {
		t.Errorf("budget defaults = %+v, trust_producer_deadline = %v; want 0.2, 10/s, 10s, false", b, cfg.Retry.TrustProducerDeadline)
	}
	if len(cfg.Retry.Tiers) != 1 || cfg.Retry.Tiers[0].D() != 2*time.Second {
		t.Errorf("tiers given in the file must replace the default list, got %v", cfg.Retry.Tiers)
	}
}

// replace returns validYAML with old replaced by new, failing if old is absent.
func replace(t *testing.T, old, new string) string {
	t.Helper()
	if !strings.Contains(validYAML, old) {
		t.Fatalf("fixture does not contain %q", old)
	}
	return strings.Replace(validYAML, old, new, 1)
}

func TestParseProblems(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // each must appear as a problem line prefix "path: ..."
	}{
		{"missing handler url", replace(t, "  url: http://127.0.0.1:8080/events\n", ""), []string{"handler.url: required"}},
		{"bad url scheme", replace(t, "http://127.0.0.1:8080/events", "ftp://127.0.0.1/x"), []string{"handler.url: scheme \"ftp\""}},
		{"http outcomes for a grpc handler", replace(t, "http://127.0.0.1:8080/events", "grpc://127.0.0.1:9000"), []string{"outcomes.http: applies to HTTP handlers only"}},
		{"no sources", replace(t, `sources:
  - name: orders
    rabbitmq:
      url: amqp://guest:guest@127.0.0.1:5672/
      queue: orders
      prefetch: 100
`, "sources: []\n"), []string{"sources: at least one source"}},
		{"duplicate names", replace(t, `sources:
`, `sources:
  - name: orders
    rabbitmq: {url: "amqp://localhost/", queue: other}
`), []string{"sources[1].name: duplicate source name \"orders\""}},
		{"two brokers", replace(t, "      prefetch: 100\n", "      prefetch: 100\n    kafka: {brokers: [\"127.0.0.1:9092\"], topic: t, group: g}\n"), []string{"sources[0]: exactly one broker"}},
		{"no broker", replace(t, `    rabbitmq:
      url: amqp://guest:guest@127.0.0.1:5672/
      queue: orders
      prefetch: 100
`, ""), []string{"sources[0]: exactly one broker"}},
		{"unknown top-level key", validYAML + "colour: blue\n", []string{"colour: unknown key"}},
		{"unknown nested key", replace(t, "queue: orders", "queue: orders\n      qeueu: typo"), []string{"sources[0].rabbitmq.qeueu: unknown key"}},
		{"bad duration", replace(t, "timeout: 5s", "timeout: 5 seconds"), []string{"handler.timeout: invalid duration \"5 seconds\""}},
		{"bare number duration", replace(t, "base: 100ms", "base: 100"), []string{"retry.base: invalid duration \"100\""}},
		{"bad tier duration", replace(t, "tiers: [1s, 10s, 1m, 10m]", "tiers: [1s, soon]"), []string{"retry.tiers[1]: invalid duration \"soon\""}},
		{"max attempts zero", replace(t, "max_attempts: 4", "max_attempts: 0"), []string{"retry.max_attempts: must be at least 1"}},
		{"max attempts not int", replace(t, "max_attempts: 4", "max_attempts: four"), []string{"retry.max_attempts: cannot use \"four\" as an integer"}},
		{"unsorted tiers", replace(t, "tiers: [1s, 10s, 1m, 10m]", "tiers: [10s, 1s]"), []string{"retry.tiers[1]: tiers must be strictly ascending"}},
		{"duplicate tier", replace(t, "tiers: [1s, 10s, 1m, 10m]", "tiers: [1s, 1s]"), []string{"retry.tiers[1]: tiers must be strictly ascending"}},
		{"sub-millisecond tier", replace(t, "tiers: [1s, 10s, 1m, 10m]", "tiers: [1500us]"), []string{"retry.tiers[0]: must be a whole number of milliseconds"}},
		{"cap below base", replace(t, "cap: 2s", "cap: 10ms"), []string{"retry.cap: must be at least retry.base"}},
		{"bad outcome name", replace(t, `{"404": permanent}`, `{"404": ignore}`), []string{"outcomes.http.404: unknown outcome \"ignore\""}},
		{"bad outcome key", replace(t, `{"404": permanent}`, `{"abc": retry}`), []string{"outcomes.http.abc: want an HTTP status"}},
		{"bad amqp scheme", replace(t, "amqp://guest:guest@127.0.0.1:5672/", "http://x/"), []string{"sources[0].rabbitmq.url: scheme \"http\""}},
		{"missing queue", replace(t, "      queue: orders\n", ""), []string{"sources[0].rabbitmq.queue: required"}},
		{"bad admin listen", replace(t, "listen: 127.0.0.1:9400", "listen: nowhere"), []string{"admin.listen: want host:port"}},
		{"deadletter retention zero", replace(t, "outcomes:\n", "deadletter: {retention: 0s}\noutcomes:\n"), []string{"deadletter.retention: must be positive"}},
		{"deadletter retention negative", replace(t, "outcomes:\n", "deadletter: {retention: -1h}\noutcomes:\n"), []string{"deadletter.retention: must be positive"}},
		{"deadletter retention in days", replace(t, "outcomes:\n", "deadletter: {retention: 14d}\noutcomes:\n"), []string{"deadletter.retention: invalid duration \"14d\""}},
		{"deadletter poll too fast", replace(t, "outcomes:\n", "deadletter: {poll: 1ms}\noutcomes:\n"), []string{"deadletter.poll: must be between 10ms and 1m"}},
		{"deadletter takeover too soon", replace(t, "outcomes:\n", "deadletter: {replay_takeover: 100ms}\noutcomes:\n"), []string{"deadletter.replay_takeover: must be at least 1s"}},
		{"list where mapping", replace(t, "journal:   {path: ./handoff.db}", "journal: [a]"), []string{"journal: want a mapping"}},
		{"budget out of range", replace(t, "outcomes:\n", "budget: {ratio: 1.5, min_per_second: -1, window: 0s}\noutcomes:\n"), []string{
			"budget.ratio: must be between 0 and 1", "budget.min_per_second: must not be negative", "budget.window: must be at least 1s"}},
		{"batch bigger than concurrency", replace(t, "  max_concurrency: 64\n", "  max_concurrency: 64\n  batch: {max_messages: 100}\n"), []string{
			"handler.batch.max_messages: 100 is more than handler.max_concurrency (64)"}},
		{"batch without wait", replace(t, "  max_concurrency: 64\n", "  max_concurrency: 64\n  batch: {max_messages: 8, max_wait: 0s}\n"), []string{
			"handler.batch.max_wait: must be positive"}},
		{"budget not a number", replace(t, "outcomes:\n", "budget: {ratio: lots}\noutcomes:\n"), []string{"budget.ratio: cannot use \"lots\" as a number"}},
		{"kafka fields", replace(t, `    rabbitmq:
      url: amqp://guest:guest@127.0.0.1:5672/
      queue: orders
      prefetch: 100
`, "    kafka: {brokers: [\"nohost\"], ordering: sideways, fetch_max_bytes: 209715200}\n"), []string{
			"sources[0].kafka.brokers[0]: want host:port", "sources[0].kafka.topic: required",
			"sources[0].kafka.group: required", "sources[0].kafka.ordering: want none, key or partition",
			"sources[0].kafka.fetch_max_bytes: want a number of bytes up to 104857600",
		}},
		{"queue name leaves no room for the dead-letter move's lock", replace(t, "queue: orders", "queue: "+strings.Repeat("q", 240)), []string{
			"sources[0].rabbitmq.queue: too long: derived queue \"" + strings.Repeat("q", 240) + ".dlq.migrating.lock\"",
		}},
		{"kafka names leave no room for the ledger topic", replace(t, `    rabbitmq:
      url: amqp://guest:guest@127.0.0.1:5672/
      queue: orders
      prefetch: 100
`, "    kafka: {brokers: [\"127.0.0.1:9092\"], topic: "+strings.Repeat("t", 200)+", group: "+strings.Repeat("g", 40)+"}\n"), []string{
			"sources[0].kafka.group: the dead-letter ledger's topic " + strings.Repeat("t", 200) + "." + strings.Repeat("g", 40) + ".dlq.ledger would be 252 characters; Kafka allows 249",
		}},
		{"kafka instance ids", replace(t, `  - name: orders
    rabbitmq:
      url: amqp://guest:guest@127.0.0.1:5672/
      queue: orders
      prefetch: 100
`, `  - {name: a, kafka: {brokers: ["127.0.0.1:9092"], topic: a, group: g, instance_id: pod-1}}
  - {name: b, kafka: {brokers: ["127.0.0.1:9092"], topic: b, group: g, instance_id: pod-1}}
  - {name: c, kafka: {brokers: ["127.0.0.1:9092"], topic: c, group: h, instance_id: pod-1}}
  - {name: d, kafka: {brokers: ["127.0.0.1:9092"], topic: d, group: g, instance_id: "pod/1"}}
`), []string{
			`sources[1].kafka.instance_id: "pod-1" is also sources[0]'s in group "g"`,
			`sources[3].kafka.instance_id: want up to 249 of a-z`,
		}},
		{"every problem at once", replace(t, "max_attempts: 4\n  base: 100ms\n  cap: 2s\n  tiers: [1s, 10s, 1m, 10m]", "max_attempts: 0\n  base: 100ms\n  cap: 1ms\n  tiers: [2s, 1s]"), []string{
			"retry.max_attempts:", "retry.cap:", "retry.tiers[1]:",
		}},
		{"duplicate key", replace(t, "timeout: 5s", "timeout: 5s\n  timeout: 6s"), []string{"handler.timeout: duplicate key"}},
		{"not yaml", "handler: [", []string{"not valid YAML"}},
		{"empty file", "", []string{"empty config file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			var ps Problems
			if !errors.As(err, &ps) {
				t.Fatalf("Parse error = %v, want Problems", err)
			}
			for _, want := range tt.want {
				found := false
				for _, p := range ps {
					if strings.HasPrefix(p.String(), want) {
						found = true
					}
				}
				if !found {
					t.Errorf("no problem starting %q in:\n%v", want, ps)
				}
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load(missing) = %v, want an error naming %s", err, path)
	}
	var ps Problems
	if errors.As(err, &ps) {
		t.Errorf("a missing file is not a content problem: %v", err)
	}
}

func TestLoadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(validYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err != nil {
		t.Fatalf("Load: %v", err)
	}
}

// start_from is earliest or latest, and latest is refused with a
// transactional transfer, whose commits go with copies only.
func TestKafkaStartFrom(t *testing.T) {
	for _, tt := range []struct {
		kafka, problem string
	}{
		{`{brokers: ["127.0.0.1:9092"], topic: t, group: g}`, ""},
		{`{brokers: ["127.0.0.1:9092"], topic: t, group: g, start_from: latest}`, ""},
		{`{brokers: ["127.0.0.1:9092"], topic: t, group: g, start_from: newest}`, `sources[0].kafka.start_from: want earliest or latest, got "newest"`},
		{`{brokers: ["127.0.0.1:9092"], topic: t, group: g, start_from: latest, transactional_transfer: true}`, "sources[0].kafka.start_from: latest needs"},
	} {
		y := "handler: {url: \"http://127.0.0.1:8080/events\"}\nsources:\n  - {name: a, kafka: " + tt.kafka + "}\n"
		_, err := Parse([]byte(y))
		switch {
		case tt.problem == "" && err != nil:
			t.Errorf("%s: %v", tt.kafka, err)
		case tt.problem != "" && (err == nil || !strings.Contains(err.Error(), tt.problem)):
			t.Errorf("%s: %v, want %q", tt.kafka, err, tt.problem)
		}
	}
}

// One pass says every problem: what does not decode and what does not
// validate alike (a value that did not decode is left at its default, so
// the rest is checked), each with its line, in the file's order.
func TestEveryProblemInOnePassWithItsLine(t *testing.T) {
	_, err := Parse([]byte(`handler:
  url: 127.0.0.1:8080/events
  timeout: fast
sources:
  - name: orders
    rabbitmq:
      url: amqp://guest:guest@127.0.0.1:5672/
      queue: orders
      prefetch: lots
      prefetch: 5
retry:
  max_atempts: 3
  tiers: [2s, 1s]
`))
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("Parse: %v, want Problems", err)
	}
	want := []string{
		`handler.url: want http://host:port/path (or https://, http+unix://, grpc://host:port), got "127.0.0.1:8080/events" (line 2)`,
		`handler.timeout: invalid duration "fast"`,
		`sources[0].rabbitmq.prefetch: cannot use "lots" as an integer (line 9)`,
		`sources[0].rabbitmq.prefetch: duplicate key (first at line 9) (line 10)`,
		`retry.max_atempts: unknown key`,
		`retry.tiers[1]: tiers must be strictly ascending: 1s is not after 2s (line 13)`,
	}
	if len(ps) != len(want) {
		t.Fatalf("%d problems, want %d:\n%v", len(ps), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(ps[i].String(), w) {
			t.Errorf("problem %d: %q, want %q", i, ps[i], w)
		}
	}
	if ps[1].Line != 3 || ps[4].Line != 12 {
		t.Errorf("lines %d and %d, want 3 and 12", ps[1].Line, ps[4].Line)
	}
}

// A share group is set instead of a consumer group, never with it, and
// refuses what only a consumer group has: an order, a transaction that
// commits an offset with its copy, a static member, a session timeout of
// its own. Each refusal names its key and why.
func TestKafkaShareGroup(t *testing.T) {
	for _, tt := range []struct {
		kafka    string
		problems []string
	}{
		{`{brokers: ["127.0.0.1:9092"], topic: t, share_group: workers}`, nil},
		{`{brokers: ["127.0.0.1:9092"], topic: t, share_group: workers, ordering: none, start_from: latest}`, nil},
		{`{brokers: ["127.0.0.1:9092"], topic: t}`, []string{"sources[0].kafka.group: required (or share_group, for a share group)"}},
		{`{brokers: ["127.0.0.1:9092"], topic: t, group: g, share_group: workers}`, []string{"sources[0].kafka.share_group: set group (a consumer group) or share_group (a share group), not both"}},
		{`{brokers: ["127.0.0.1:9092"], topic: t, share_group: workers, ordering: key, transactional_transfer: true, instance_id: pod-1, session_timeout: 10s}`, []string{
			"sources[0].kafka.ordering: a share group hands a partition's records to several members at once",
			"sources[0].kafka.transactional_transfer: a share group's acknowledgements cannot be part of a Kafka transaction",
			"sources[0].kafka.instance_id: a share group has no static members",
			"sources[0].kafka.session_timeout: a share group's session timeout is the brokers'",
		}},
		{`{brokers: ["127.0.0.1:9092"], topic: ` + strings.Repeat("t", 200) + `, share_group: ` + strings.Repeat("s", 40) + `}`, []string{
			"sources[0].kafka.share_group: the dead-letter ledger's topic " + strings.Repeat("t", 200) + "." + strings.Repeat("s", 40) + ".dlq.ledger would be 252 characters",
		}},
	} {
		y := "handler: {url: \"http://127.0.0.1:8080/events\"}\nsources:\n  - {name: a, kafka: " + tt.kafka + "}\n"
		c, err := Parse([]byte(y))
		if len(tt.problems) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tt.kafka, err)
			} else if k := c.Sources[0].Kafka; k.GroupName() != "workers" || k.InstanceID != "" {
				t.Errorf("%s: group %q, instance id %q; want the share group and no static id", tt.kafka, k.GroupName(), k.InstanceID)
			}
			// validate says what the brokers' limits imply.
			if n := strings.Join(c.Notices(), "\n"); !strings.Contains(n, "sources[0].kafka.share_group: workers — the brokers archive a record delivered share.delivery.count.limit times") {
				t.Errorf("%s: notices %q, want the share group's limits explained", tt.kafka, n)
			}
			continue
		}
		for _, p := range tt.problems {
			if err == nil || !strings.Contains(err.Error(), p) {
				t.Errorf("%s: %v, want %q", tt.kafka, err, p)
			}
		}
	}
}

// The default prefetch is four deliveries a call, up to what AMQP's 16-bit
// prefetch count can say; one set by hand is kept.
func TestPrefetchDefault(t *testing.T) {
	for _, tt := range []struct {
		handler, source string
		want            int
	}{
		{"max_concurrency: 64", "", 256},
		{"max_concurrency: 20000", "", 65535},
		{"max_concurrency: 64", ", prefetch: 10", 10},
	} {
		cfg, err := Parse([]byte(`
handler: {url: "http://127.0.0.1:8080/events", ` + tt.handler + `}
sources: [{name: a, rabbitmq: {url: "amqp://localhost/", queue: a` + tt.source + `}}]
`))
		if err != nil {
			t.Fatalf("%s%s: %v", tt.handler, tt.source, err)
		}
		if got := cfg.Sources[0].RabbitMQ.Prefetch; got != tt.want {
			t.Errorf("%s%s: prefetch = %d, want %d", tt.handler, tt.source, got, tt.want)
		}
	}
}
