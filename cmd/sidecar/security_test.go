package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// secretFile writes a one-line secret, as a mounted Secret holds it.
func secretFile(t *testing.T, secret string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func randomName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// threeOutcomes is an app that takes ok-* at once, fails flaky-* once with
// 503 (so it goes through a retry tier: a transfer) and rejects bad-* with
// 422 (a dead letter).
func threeOutcomes(t *testing.T) *app {
	return newApp(t, func(w http.ResponseWriter, c call, prior []call) {
		switch id := c.Header.Get("Ce-Id"); {
		case strings.HasPrefix(id, "flaky-") && len(prior) == 0:
			w.WriteHeader(http.StatusServiceUnavailable)
		case strings.HasPrefix(id, "bad-"):
			w.WriteHeader(http.StatusUnprocessableEntity)
		default:
			w.WriteHeader(http.StatusOK)
		}
	})
}

// checkThreeOutcomes waits until ok-1 was handled once and flaky-1 twice,
// the second time as attempt 2.
func checkThreeOutcomes(t *testing.T, a *app) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, "ok-1 handled and flaky-1 retried", func() bool {
		return len(a.callsFor("ok-1")) == 1 && len(a.callsFor("flaky-1")) == 2
	})
	if got := a.callsFor("flaky-1")[1].Header.Get("Handoff-Attempt"); got != "2" {
		t.Errorf("flaky-1's second call is attempt %q, want 2", got)
	}
}

// TestRabbitMQOverTLS consumes, retries and dead-letters over amqps:// with
// the CA and a client certificate from config (the broker requires one) and
// the password from a file: RabbitMQ itself says the connection is TLS.
func TestRabbitMQOverTLS(t *testing.T) {
	t.Parallel()
	certs := brokertest.LocalTLS(t)
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{tier})
	a := threeOutcomes(t)
	cfg := testConfig(a.url(), q, tier)
	name := randomName("tls-")
	r := &config.RabbitMQ{URL: brokertest.RabbitTLSURL(), Queue: q, Prefetch: 16, Declare: cfg.Sources[0].RabbitMQ.Declare,
		TLS:         &config.TLS{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey},
		Credentials: config.Credentials{Username: "guest", PasswordFile: secretFile(t, "guest")}}
	cfg.Sources = []config.Source{{Name: name, RabbitMQ: r}}
	startSidecar(t, cfg)
	publish(t, conn, q, publishing{MessageId: "ok-1"}, publishing{MessageId: "flaky-1"}, publishing{MessageId: "bad-1"})
	checkThreeOutcomes(t, a)
	testkit.Eventually(t, 30*time.Second, "bad-1 in the dead-letter stream", func() bool {
		for _, d := range readStream(t, conn, rabbitmq.DeadLetterQueue(q)) {
			if d.MessageId == "bad-1" {
				return true
			}
		}
		return false
	})
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "client_properties", "ssl", "ssl_protocol").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_connections: %v\n%s", err, out)
	}
	mine := 0
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, "handoff "+name) {
			continue
		}
		mine++
		if !strings.Contains(line, "\ttrue\t") {
			t.Errorf("a sidecar connection is not TLS: %s", line)
		}
	}
	if mine == 0 {
		t.Fatalf("no connection named %q in:\n%s", "handoff "+name, out)
	}
}

// kafkaSecureConfig is kafkaConfig on the brokers of a secured listener.
func kafkaSecureConfig(t *testing.T, appURL string, brokers []string, topic string, tls *config.TLS, sasl *config.SASL) config.Config {
	cfg := kafkaConfig(appURL, brokers, topic, tier)
	cfg.Sources[0].Name = randomName("secure-")
	cfg.Sources[0].Kafka.TLS = tls
	cfg.Sources[0].Kafka.SASL = sasl
	return cfg
}

// runKafkaThreeOutcomes produces one record of each outcome on the plain
// listener and checks the sidecar, on a secured one, handled, retried and
// dead-lettered them.
func runKafkaThreeOutcomes(t *testing.T, secure []string, tls *config.TLS, sasl *config.SASL) {
	t.Helper()
	plain, topic := brokertest.KafkaTopic(t, "secure", 1)
	a := threeOutcomes(t)
	startSidecar(t, kafkaSecureConfig(t, a.url(), secure, topic, tls, sasl))
	var recs []*kgo.Record
	for _, id := range []string{"ok-1", "flaky-1", "bad-1"} {
		recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}})
	}
	produceKafka(t, plain, recs...)
	checkThreeOutcomes(t, a)
	dlq := kafka.DeadLetterTopic(topic, kafkaGroup(topic))
	testkit.Eventually(t, 30*time.Second, "bad-1 in the dead-letter topic", func() bool {
		for _, r := range readTopic(t, plain, dlq) {
			if string(r.Value) == "bad-1" {
				return true
			}
		}
		return false
	})
}

// TestKafkaOverTLS consumes, retries and dead-letters through Kafka's SSL
// listener, which requires the client certificate from config.
func TestKafkaOverTLS(t *testing.T) {
	t.Parallel()
	certs := brokertest.LocalTLS(t)
	runKafkaThreeOutcomes(t, brokertest.KafkaTLSBrokers(),
		&config.TLS{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}, nil)
}

// scramUser creates a SCRAM user with a random name on the local Kafka and
// removes it when the test ends.
func scramUser(t *testing.T, mechanism kadm.ScramMechanism, password string) string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokertest.KafkaBrokers()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	user := randomName("handoff-")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: user, Mechanism: mechanism, Iterations: 4096, Password: password}})
	if err == nil {
		for _, r := range res {
			if r.Err != nil {
				err = fmt.Errorf("%w: %s", r.Err, r.ErrMessage)
			}
		}
	}
	if err != nil {
		t.Fatalf("create SCRAM user: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.AlterUserSCRAMs(ctx, []kadm.DeleteSCRAM{{User: user, Mechanism: mechanism}}, nil)
	})
	return user
}

// TestKafkaOverSASL consumes, retries and dead-letters through Kafka's
// SASL_SSL listener with each mechanism, the password from a file (PLAIN)
// or the environment (SCRAM).
func TestKafkaOverSASL(t *testing.T) {
	t.Parallel()
	certs := brokertest.LocalTLS(t)
	tls := &config.TLS{CAFile: certs.CA}
	t.Run("PLAIN", func(t *testing.T) {
		t.Parallel()
		runKafkaThreeOutcomes(t, brokertest.KafkaSASLBrokers(), tls, &config.SASL{Mechanism: config.SASLPlain,
			Credentials: config.Credentials{Username: brokertest.KafkaPlainUser, PasswordFile: secretFile(t, brokertest.KafkaPlainPassword)}})
	})
	for _, m := range []struct {
		name string
		kadm kadm.ScramMechanism
	}{{config.SASLScramSHA256, kadm.ScramSha256}, {config.SASLScramSHA512, kadm.ScramSha512}} {
		t.Run(m.name, func(t *testing.T) {
			password := randomName("pw-")
			user := scramUser(t, m.kadm, password)
			// t.Setenv rules out a parallel test; a variable of its own
			// keeps this one apart from the others.
			env := "HANDOFF_TEST_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_"))
			if err := os.Setenv(env, password); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.Unsetenv(env) })
			runKafkaThreeOutcomes(t, brokertest.KafkaSASLBrokers(), tls, &config.SASL{Mechanism: m.name,
				Credentials: config.Credentials{Username: user, PasswordEnv: env}})
		})
	}
}

// TestRefusedIsAClearError runs the binary with credentials or a
// certificate the broker refuses: it says so at error level, naming the
// source and what to check, /readyz says refused, and nothing reaches the
// app. It keeps retrying (a rotated Secret mends it) with backoff, not in a
// loop.
func TestRefusedIsAClearError(t *testing.T) {
	t.Parallel()
	certs := brokertest.LocalTLS(t)
	bin := sidecarBinary(t)
	cases := []struct {
		name, source, want string
	}{
		{"rabbitmq wrong password", fmt.Sprintf(`rabbitmq:
      url: %q
      queue: never-declared
      username: guest
      password_file: %q
      tls: {ca_file: %q, cert_file: %q, key_file: %q}`, brokertest.RabbitTLSURL(), secretFile(t, "not-the-password"), certs.CA, certs.ClientCert, certs.ClientKey),
			"the user name or password was not accepted"},
		{"kafka scram wrong password", fmt.Sprintf(`kafka:
      brokers: [%q]
      topic: never-created
      group: never-joined
      tls: {ca_file: %q}
      sasl: {mechanism: SCRAM-SHA-512, username: %s, password_file: %q}`, brokertest.KafkaSASLBrokers()[0], certs.CA,
			scramUser(t, kadm.ScramSha512, "right-password"), secretFile(t, "wrong-password")),
			"SASL authentication failed"},
		{"kafka no client certificate", fmt.Sprintf(`kafka:
      brokers: [%q]
      topic: never-created
      group: never-joined
      tls: {ca_file: %q}`, brokertest.KafkaTLSBrokers()[0], certs.CA),
			"the broker ended the TLS handshake"},
		{"rabbitmq untrusted broker", fmt.Sprintf(`rabbitmq:
      url: %q
      queue: never-declared
      tls: {cert_file: %q, key_file: %q}`, strings.Replace(brokertest.RabbitTLSURL(), "amqps://", "amqps://guest:guest@", 1), certs.ClientCert, certs.ClientKey),
			"the broker's certificate is not trusted"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			calls := 0
			a := newApp(t, func(w http.ResponseWriter, _ call, _ []call) {
				mu.Lock()
				calls++
				mu.Unlock()
				w.WriteHeader(http.StatusOK)
			})
			source := randomName("refused-")
			path := writeFile(t, fmt.Sprintf(`handler: {url: %q}
sources:
  - name: %s
    %s
telemetry: {metrics_listen: "127.0.0.1:0"}
journal: {path: %q}
`, a.url(), source, c.source, filepath.Join(t.TempDir(), "handoff.db")))
			r := startBinary(t, bin, path)
			var line string
			testkit.Eventually(t, 30*time.Second, "an error naming the source and the refusal", func() bool {
				for _, l := range strings.Split(r.log.String(), "\n") {
					if strings.Contains(l, `"level":"ERROR"`) && strings.Contains(l, "refused the sidecar") &&
						strings.Contains(l, c.want) && strings.Contains(l, `"source":"`+source+`"`) {
						line = l
						return true
					}
				}
				return false
			})
			t.Logf("%s", line)
			testkit.Eventually(t, 15*time.Second, "/readyz to say refused", func() bool {
				_, readyz := healthBodies(t, r.health)
				return strings.HasPrefix(readyz, "503") && strings.Contains(readyz, "refused")
			})
			// Backoff, not a loop: a few attempts in the time it takes to
			// see the first.
			errors := strings.Count(r.log.String(), "refused the sidecar")
			if errors > 50 {
				t.Errorf("%d refusal lines already: a retry loop without backoff", errors)
			}
			r.stop(t)
			mu.Lock()
			defer mu.Unlock()
			if calls != 0 {
				t.Errorf("the app got %d calls through a refused connection", calls)
			}
		})
	}
}
