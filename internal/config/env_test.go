package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const envYAML = `
handler: {url: "http://127.0.0.1:8080/events"}
sources:
  - {name: orders, kafka: {brokers: ["127.0.0.1:9092"], topic: o, group: g}}
  - {name: "pay ments", kafka: {brokers: ["127.0.0.1:9092"], topic: p, group: g}}
  - {name: other, kafka: {brokers: ["127.0.0.1:9092"], topic: x, group: h}}
  - {name: fixed, kafka: {brokers: ["127.0.0.1:9092"], topic: y, group: i, instance_id: chosen}}
  - {name: queue, rabbitmq: {url: "amqp://localhost/", queue: q}}
  - {name: shared, kafka: {brokers: ["127.0.0.1:9092"], topic: z, share_group: w}}
journal: {path: ./file.db}
`

func lookupIn(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func loadEnv(t *testing.T, yaml string, env map[string]string) (Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "handoff.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return LoadEnv(path, lookupIn(env))
}

// The variables a pod's platform sets replace the file's values; an
// instance id is shared by the sources of different groups and made unique,
// with the source's name, within one; a source's own id stays, and a share
// group's source gets none.
func TestEnvOverrides(t *testing.T) {
	cfg, err := loadEnv(t, envYAML, map[string]string{
		"HANDOFF_JOURNAL_PATH":     "/var/lib/handoff/journal.db",
		"HANDOFF_ADMIN_LISTEN":     "127.0.0.1:9500",
		"HANDOFF_ADMIN_TOKEN_FILE": "/etc/handoff/token/token",
		"HANDOFF_METRICS_LISTEN":   "0.0.0.0:9464",
		"HANDOFF_INSTANCE_ID":      "orders-7f9c-x2",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Journal.Path != "/var/lib/handoff/journal.db" || cfg.Admin.Listen != "127.0.0.1:9500" ||
		cfg.Admin.TokenFile != "/etc/handoff/token/token" || cfg.Telemetry.MetricsListen != "0.0.0.0:9464" {
		t.Errorf("overrides not applied: journal %q, admin %q %q, metrics %q", cfg.Journal.Path, cfg.Admin.Listen, cfg.Admin.TokenFile, cfg.Telemetry.MetricsListen)
	}
	want := []string{"orders-7f9c-x2-orders", "orders-7f9c-x2-pay-ments", "orders-7f9c-x2", "chosen"}
	for i, w := range want {
		if got := cfg.Sources[i].Kafka.InstanceID; got != w {
			t.Errorf("sources[%d] instance id %q, want %q", i, got, w)
		}
	}
	if got := cfg.Sources[5].Kafka.InstanceID; got != "" {
		t.Errorf("the share group's source was given the instance id %q; a share group has no static members", got)
	}

	// A token from the environment (a Secret's key) takes the file's place.
	cfg, err = loadEnv(t, envYAML+"admin: {token_file: /etc/t}\n", map[string]string{"HANDOFF_ADMIN_TOKEN": " s3cret\n"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Admin.Token != "s3cret" || cfg.Admin.TokenFile != "" || !cfg.Admin.Enabled() {
		t.Errorf("HANDOFF_ADMIN_TOKEN: token %q, file %q, enabled %v", cfg.Admin.Token, cfg.Admin.TokenFile, cfg.Admin.Enabled())
	}

	// Unset or empty, the file's values stand.
	cfg, err = loadEnv(t, envYAML, map[string]string{"HANDOFF_JOURNAL_PATH": ""})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Journal.Path != "./file.db" || cfg.Sources[0].Kafka.InstanceID != "" {
		t.Errorf("an empty variable changed the config: journal %q, instance id %q", cfg.Journal.Path, cfg.Sources[0].Kafka.InstanceID)
	}
}

// A bad value from the environment is refused at its key, naming the
// variable that set it.
func TestEnvOverrideProblemNamesTheVariable(t *testing.T) {
	_, err := loadEnv(t, envYAML, map[string]string{"HANDOFF_INSTANCE_ID": "no spaces allowed"})
	wantProblem(t, err, "sources[2].kafka.instance_id: want up to 249")
	if !strings.Contains(err.Error(), "(set by HANDOFF_INSTANCE_ID)") {
		t.Errorf("problem does not name the variable: %v", err)
	}
	_, err = loadEnv(t, envYAML, map[string]string{"HANDOFF_HTTP_DRAIN": "sure"})
	wantProblem(t, err, `shutdown.http_drain: want true or false, got "sure" (set by HANDOFF_HTTP_DRAIN)`)
	_, err = loadEnv(t, envYAML, map[string]string{"HANDOFF_HTTP_DRAIN": "true", "HANDOFF_METRICS_LISTEN": ""})
	if err != nil {
		t.Errorf("http_drain with the default metrics listener: %v", err)
	}
	_, err = loadEnv(t, envYAML+"telemetry: {metrics_listen: \"\"}\n", map[string]string{"HANDOFF_HTTP_DRAIN": "1"})
	wantProblem(t, err, "shutdown.http_drain: needs telemetry.metrics_listen")
	_, err = loadEnv(t, envYAML, map[string]string{"HANDOFF_METRICS_LISTEN": "nowhere"})
	wantProblem(t, err, "telemetry.metrics_listen:")
	if !strings.Contains(err.Error(), "(set by HANDOFF_METRICS_LISTEN)") {
		t.Errorf("problem does not name the variable: %v", err)
	}
}

func TestMatchesSourcePath(t *testing.T) {
	for path, want := range map[string]bool{
		"sources[0].kafka.instance_id":  true,
		"sources[12].kafka.instance_id": true,
		"sources[].kafka.instance_id":   false,
		"sources[x].kafka.instance_id":  false,
		"sources[1].kafka.group":        false,
		"journal.path":                  false,
	} {
		if got := matchesSourcePath(path, "sources[*].kafka.instance_id"); got != want {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
}

// GET /drain stops the sidecar: on a listener other hosts reach it needs
// HANDOFF_DRAIN_TOKEN, on loopback it may go without; a token too short
// to guard anything is refused, and none of the problems quote it.
func TestDrainToken(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	tests := []struct {
		name string
		env  map[string]string
		want string // a problem, or "" for valid
	}{
		{"pod address without a token", map[string]string{"HANDOFF_HTTP_DRAIN": "true", "HANDOFF_METRICS_LISTEN": "0.0.0.0:9464"},
			`shutdown.http_drain: telemetry.metrics_listen "0.0.0.0:9464" is reachable from other hosts`},
		{"every interface without a token", map[string]string{"HANDOFF_HTTP_DRAIN": "true", "HANDOFF_METRICS_LISTEN": ":9464"},
			`shutdown.http_drain: telemetry.metrics_listen ":9464" is reachable from other hosts`},
		{"pod address with a token", map[string]string{"HANDOFF_HTTP_DRAIN": "true", "HANDOFF_METRICS_LISTEN": "0.0.0.0:9464", "HANDOFF_DRAIN_TOKEN": token}, ""},
		{"loopback without a token", map[string]string{"HANDOFF_HTTP_DRAIN": "true", "HANDOFF_METRICS_LISTEN": "127.0.0.1:9464"}, ""},
		{"localhost without a token", map[string]string{"HANDOFF_HTTP_DRAIN": "true", "HANDOFF_METRICS_LISTEN": "localhost:9464"}, ""},
		{"no drain, any address", map[string]string{"HANDOFF_METRICS_LISTEN": "0.0.0.0:9464"}, ""},
		{"short token", map[string]string{"HANDOFF_HTTP_DRAIN": "true", "HANDOFF_DRAIN_TOKEN": "hunter2"},
			"shutdown.drain_token: want at least 16 bytes of printable text without spaces (a header value), got 7 bytes (set by HANDOFF_DRAIN_TOKEN)"},
		{"token with a space", map[string]string{"HANDOFF_DRAIN_TOKEN": "0123456789 abcdef"}, "shutdown.drain_token: want at least 16"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadEnv(t, envYAML, tc.env)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if cfg.Shutdown.DrainToken != tc.env["HANDOFF_DRAIN_TOKEN"] {
					t.Errorf("drain token %q, want the variable's", cfg.Shutdown.DrainToken)
				}
				return
			}
			wantProblem(t, err, tc.want)
			if tok := tc.env["HANDOFF_DRAIN_TOKEN"]; tok != "" && strings.Contains(err.Error(), tok) {
				t.Errorf("the problem quotes the token: %v", err)
			}
		})
	}
}

// HANDOFF_DRAIN_TIMEOUT is how the injector makes the drain fit the pod's
// grace period: it replaces the file's shutdown.drain_timeout, and a value
// that is not a duration is refused naming it.
func TestDrainTimeoutFromEnv(t *testing.T) {
	cfg, err := loadEnv(t, envYAML+"shutdown: {drain_timeout: 45s}\n", map[string]string{"HANDOFF_DRAIN_TIMEOUT": "20s"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Shutdown.DrainTimeout.D() != 20*time.Second {
		t.Errorf("drain timeout %v, want the variable's 20s", cfg.Shutdown.DrainTimeout.D())
	}
	_, err = loadEnv(t, envYAML, map[string]string{"HANDOFF_DRAIN_TIMEOUT": "20"})
	wantProblem(t, err, `shutdown.drain_timeout: want a duration such as 20s, got "20" (set by HANDOFF_DRAIN_TIMEOUT)`)
	_, err = loadEnv(t, envYAML, map[string]string{"HANDOFF_DRAIN_TIMEOUT": "-5s"})
	wantProblem(t, err, "shutdown.drain_timeout: must not be negative (set by HANDOFF_DRAIN_TIMEOUT)")
}

// docs/configuration.md's table of environment variables names every one
// the config reads: a variable the injector sets and no page explains is a
// setting nobody can find.
func TestDocsListEveryEnvVariable(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range EnvNames() {
		if !strings.Contains(string(readme), "| `"+v[0]+"` |") {
			t.Errorf("docs/configuration.md has no row for %s (%s)", v[0], v[1])
		}
	}
}
