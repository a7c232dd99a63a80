package brokertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TLSFiles are the certificates scripts/tls-local makes for the local
// brokers' TLS listeners and their clients.
type TLSFiles struct {
	CA, ClientCert, ClientKey string
}

// LocalTLS returns the local brokers' certificates: HANDOFF_TLS_DIR, else
// .cache/tls in the module's root. Missing ones fail the test (make brokers
// makes them); under -short it is skipped.
func LocalTLS(t *testing.T) TLSFiles {
	t.Helper()
	SkipShort(t, "the local brokers' TLS listeners")
	dir := os.Getenv("HANDOFF_TLS_DIR")
	if dir == "" {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			t.Fatalf("go env GOMOD: %v", err)
		}
		dir = filepath.Join(filepath.Dir(strings.TrimSpace(string(out))), ".cache", "tls")
	}
	f := TLSFiles{
		CA:         filepath.Join(dir, "ca.pem"),
		ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey:  filepath.Join(dir, "client-key.pem"),
	}
	for _, p := range []string{f.CA, f.ClientCert, f.ClientKey} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the local brokers' certificates are required (make brokers makes them): %v", err)
		}
	}
	return f
}

// KafkaTLSBrokers is the local Kafka's SSL listener, which requires a client
// certificate: HANDOFF_KAFKA_TLS_BROKERS, else the one scripts/kafka-local
// opens.
func KafkaTLSBrokers() []string { return envList("HANDOFF_KAFKA_TLS_BROKERS", "127.0.0.1:19094") }

// KafkaSASLBrokers is the local Kafka's SASL_SSL listener (PLAIN,
// SCRAM-SHA-256, SCRAM-SHA-512): HANDOFF_KAFKA_SASL_BROKERS, else the one
// scripts/kafka-local opens.
func KafkaSASLBrokers() []string { return envList("HANDOFF_KAFKA_SASL_BROKERS", "127.0.0.1:19095") }

// KafkaPlainUser is the PLAIN user scripts/kafka-local configures.
const KafkaPlainUser, KafkaPlainPassword = "handoff", "handoff-plain-secret"

// RabbitURL is the local RabbitMQ's plain listener: HANDOFF_RABBITMQ_URL,
// else the one scripts/rabbitmq-local opens.
func RabbitURL() string {
	if u := os.Getenv("HANDOFF_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// RabbitTLSURL is the local RabbitMQ's TLS listener, which requires a client
// certificate: HANDOFF_RABBITMQ_TLS_URL, else the one scripts/rabbitmq-local
// opens. It holds no credentials.
func RabbitTLSURL() string {
	if v := os.Getenv("HANDOFF_RABBITMQ_TLS_URL"); v != "" {
		return v
	}
	return "amqps://127.0.0.1:5671/"
}

func envList(name, def string) []string {
	if v := os.Getenv(name); v != "" {
		return strings.Split(v, ",")
	}
	return []string{def}
}
