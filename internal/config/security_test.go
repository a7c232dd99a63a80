package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// securityYAML is a config with one RabbitMQ and one Kafka source whose
// security settings are rabbit and kafka (indented under their broker).
func securityYAML(rabbit, kafka string) string {
	return fmt.Sprintf(`handler: {url: "http://127.0.0.1:8080/events"}
sources:
  - name: r
    rabbitmq:
      url: amqps://broker:5671/
      queue: q
%s
  - name: k
    kafka:
      brokers: ["broker:9093"]
      topic: t
      group: g
%s
`, rabbit, kafka)
}

func TestSecurityConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pw := write("pw", "s3cret\n")
	empty := write("empty", "\n")
	ca := write("ca.pem", "not a certificate")
	missing := filepath.Join(dir, "missing")

	t.Run("valid", func(t *testing.T) {
		t.Setenv("HANDOFF_TEST_KAFKA_PW", "from-env")
		cfg, err := Parse([]byte(securityYAML(
			"      username: orders\n      password_file: "+pw+"\n      tls: {server_name: rabbit.internal}",
			"      tls: {}\n      sasl: {mechanism: SCRAM-SHA-512, username: orders, password_env: HANDOFF_TEST_KAFKA_PW}")))
		if err != nil {
			t.Fatal(err)
		}
		r, k := cfg.Sources[0].RabbitMQ, cfg.Sources[1].Kafka
		if u, _ := r.User(); u != "orders" {
			t.Errorf("rabbitmq user = %q", u)
		}
		if p, err := r.Secret(); p != "s3cret" || err != nil {
			t.Errorf("rabbitmq password = %q, %v; want the file's line without its newline", p, err)
		}
		if r.TLS == nil || r.TLS.ServerName != "rabbit.internal" {
			t.Errorf("rabbitmq tls = %+v", r.TLS)
		}
		if k.TLS == nil || k.SASL == nil || k.SASL.Mechanism != SASLScramSHA512 {
			t.Fatalf("kafka tls = %+v, sasl = %+v", k.TLS, k.SASL)
		}
		if p, err := k.SASL.Secret(); p != "from-env" || err != nil {
			t.Errorf("kafka password = %q, %v", p, err)
		}
		// Read at each connection: a rotated file is what the next one
		// uses.
		if err := os.WriteFile(pw, []byte("rotated\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if p, _ := r.Secret(); p != "rotated" {
			t.Errorf("after rotation the password is %q", p)
		}
		if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	})

	tests := []struct {
		name, rabbit, kafka string
		want                []string
	}{
		{"missing password file", "      username: u\n      password_file: " + missing, "",
			[]string{"sources[0].rabbitmq.password_file: open " + missing}},
		{"empty password file", "      username: u\n      password_file: " + empty, "",
			[]string{"sources[0].rabbitmq.password_file: " + empty + " is empty"}},
		{"two password sources", "      username: u\n      password: p\n      password_file: " + pw, "",
			[]string{"sources[0].rabbitmq.password: set one of password, password_file and password_env"}},
		{"password without user", "      password_file: " + pw, "",
			[]string{"sources[0].rabbitmq.username: required with a password"}},
		{"unset env", "", "      sasl: {mechanism: PLAIN, username: u, password_env: HANDOFF_TEST_UNSET_VARIABLE}",
			[]string{"sources[1].kafka.sasl.password_env: $HANDOFF_TEST_UNSET_VARIABLE is not set or empty"}},
		{"bad mechanism", "", "      sasl: {mechanism: GSSAPI, username: u, password_file: " + pw + "}",
			[]string{`sources[1].kafka.sasl.mechanism: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got "GSSAPI"`}},
		{"sasl without password", "", "      sasl: {mechanism: PLAIN, username: u}",
			[]string{"sources[1].kafka.sasl.password_file: a password is required"}},
		{"cert without key", "      tls: {cert_file: " + pw + "}", "",
			[]string{"sources[0].rabbitmq.tls.cert_file: cert_file and key_file go together"}},
		{"CA file not PEM", "", "      tls: {ca_file: " + ca + "}",
			[]string{"sources[1].kafka.tls.ca_file: " + ca + " holds no PEM certificate"}},
		{"CA file missing", "", "      tls: {ca_file: " + missing + "}",
			[]string{"sources[1].kafka.tls.ca_file: open " + missing}},
		{"unknown tls key", "      tls: {ca: x}", "",
			[]string{"sources[0].rabbitmq.tls.ca: unknown key"}},
		{"unknown sasl key", "", "      sasl: {mechanism: PLAIN, user: u}",
			[]string{"sources[1].kafka.sasl.user: unknown key"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(securityYAML(tc.rabbit, tc.kafka)))
			for _, w := range tc.want {
				wantProblem(t, err, w)
			}
		})
	}

	t.Run("tls on amqp", func(t *testing.T) {
		y := strings.Replace(securityYAML("      tls: {}", ""), "amqps://", "amqp://", 1)
		_, err := Parse([]byte(y))
		wantProblem(t, err, "sources[0].rabbitmq.tls: applies to an amqps:// url")
	})
	t.Run("user in url and in username", func(t *testing.T) {
		y := strings.Replace(securityYAML("      username: u\n      password_file: "+pw, ""), "amqps://", "amqps://a:b@", 1)
		_, err := Parse([]byte(y))
		wantProblem(t, err, "sources[0].rabbitmq.url: holds a user as well as")
	})
	t.Run("inline password is never in a problem", func(t *testing.T) {
		_, err := Parse([]byte(securityYAML("      username: u\n      password: hunter2-secret\n      password_env: X", "")))
		if err == nil || strings.Contains(err.Error(), "hunter2-secret") {
			t.Errorf("Parse = %v", err)
		}
	})
}
