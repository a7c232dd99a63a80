package main

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/testkit"
)

// TestNoSecretInAnyOutput runs the real binary with a password in every URL
// its config holds — the handler's, checked by the app as basic auth, and a
// RabbitMQ user's of the test's own — then with a wrong RabbitMQ password so
// that connection errors are logged, and validates a config whose URLs do
// not parse. No password is in the run logs, the validate and run output,
// /healthz and /readyz, the DLQ copies' headers or the journal.
func TestNoSecretInAnyOutput(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	conn := dialRabbit(t)
	handlerPass, rabbitPass, wrongPass := secret(t), secret(t), secret(t)
	secrets := []string{handlerPass, rabbitPass, wrongPass}

	rabbitUser := "handoff-test-" + secret(t)
	rabbitmqctl(t, "add_user", rabbitUser, rabbitPass)
	t.Cleanup(func() { _ = exec.Command("rabbitmqctl", "delete_user", rabbitUser).Run() })
	rabbitmqctl(t, "set_permissions", "-p", "/", rabbitUser, ".*", ".*", ".*")

	tier := 300 * time.Millisecond
	q := testQueue(t, conn, []time.Duration{tier})
	wantAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte("app:"+handlerPass))
	var (
		mu      sync.Mutex
		handled = map[string]bool{}
	)
	a := newApp(t, func(w http.ResponseWriter, c call, prior []call) {
		if got := c.Header.Get("Authorization"); got != wantAuth {
			t.Errorf("app: Authorization %q, want the handler URL's user and password", got)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		id := c.Header.Get("Ce-Id")
		switch {
		case strings.HasPrefix(id, "poison"):
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		case strings.HasPrefix(id, "hangup") && len(prior) == 0:
			// No answer at all: the attempt fails with a transport error,
			// whose text becomes the attempt's evidence.
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		mu.Lock()
		handled[id] = true
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	handlerURL := strings.Replace(a.url(), "http://", "http://app:"+handlerPass+"@", 1)
	rabbitAt := strings.TrimPrefix(brokertest.RabbitURL(), "amqp://guest:guest@")
	config := func(rabbitPass string) string {
		return writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 4}
sources:
  - name: secret
    rabbitmq: {url: %q, queue: %q, prefetch: 4}
retry: {max_attempts: 3, tiers: [%s], base: 50ms, cap: 200ms}
telemetry: {metrics_listen: "127.0.0.1:0"}
admin: {listen: "127.0.0.1:0"}
journal: {path: %q}
`, handlerURL, "amqp://"+rabbitUser+":"+rabbitPass+"@"+rabbitAt, q, tier, filepath.Join(t.TempDir(), "handoff.db")))
	}
	good := config(rabbitPass)

	var msgs []publishing
	for _, id := range []string{"ok-1", "ok-2", "ok-3", "poison-1", "hangup-1"} {
		msgs = append(msgs, publishing{MessageId: id, Body: []byte(id)})
	}
	publish(t, conn, q, msgs...)

	// The run: every message through, with the password in use.
	run := startBinary(t, bin, good)
	testkit.Eventually(t, 30*time.Second, "the messages handled or dead-lettered", func() bool {
		mu.Lock()
		n := len(handled)
		mu.Unlock()
		return n == 4 && len(readStream(t, conn, rabbitmq.DeadLetterQueue(q))) == 1
	})
	healthz, readyz := healthBodies(t, run.health)
	run.stop(t)
	if !strings.Contains(run.log.String(), "app:xxxxx@") {
		t.Errorf("the log does not show the handler URL redacted; the test would not see it leak:\n%s", run.log.String())
	}
	noSecret(t, "run log", run.log.String(), secrets)
	noSecret(t, "/healthz while running", healthz, secrets)
	noSecret(t, "/readyz while running", readyz, secrets)
	for _, d := range readStream(t, conn, rabbitmq.DeadLetterQueue(q)) {
		noSecret(t, "DLQ copy headers", fmt.Sprint(d.Headers), secrets)
	}
	journalOut, err := exec.Command(bin, "journal", "events", "--path", journalPath(t, good)).CombinedOutput()
	if err != nil || !strings.Contains(string(journalOut), "hangup-1") {
		t.Errorf("journal events: %v\n%s", err, journalOut)
	}
	noSecret(t, "journal events", string(journalOut), secrets)

	// A wrong RabbitMQ password: connection errors are logged and /readyz
	// says why it is not ready.
	refused := startBinary(t, bin, config(wrongPass))
	testkit.Eventually(t, 30*time.Second, "two refused connection attempts logged", func() bool {
		return strings.Count(refused.log.String(), "rabbitmq refused the sidecar") >= 2
	})
	healthz, readyz = healthBodies(t, refused.health)
	refused.stop(t)
	if !strings.Contains(readyz, "broker not connected") {
		t.Errorf("/readyz with a refused login says %q, want the reason", readyz)
	}
	noSecret(t, "run log with a wrong password", refused.log.String(), secrets)
	noSecret(t, "/healthz with a wrong password", healthz, secrets)
	noSecret(t, "/readyz with a wrong password", readyz, secrets)

	// URLs that do not parse: a '/' and a '#' in the passwords. What comes
	// before the '#' reads as host:port, so the password starts with a
	// letter: a hex one of digits only would read as a port.
	bad := writeFile(t, fmt.Sprintf(`handler: {url: %q}
sources:
  - name: secret
    rabbitmq: {url: %q, queue: %q}
`, strings.Replace(a.url(), "http://", "http://app:z"+handlerPass+"/1@", 1), "amqp://"+rabbitUser+":z"+rabbitPass+"#1@"+rabbitAt, q))
	for _, cmd := range []string{"validate", "run"} {
		out, err := exec.Command(bin, cmd, "--config", bad).CombinedOutput()
		if exitCode(err) != 2 || !bytes.Contains(out, []byte("handler.url: not a URL")) || !bytes.Contains(out, []byte("rabbitmq.url: not a URL")) ||
			!bytes.Contains(out, []byte("app:xxxxx@")) {
			t.Errorf("%s of a config whose URLs do not parse: exit %d, want 2 naming both URLs, redacted:\n%s", cmd, exitCode(err), out)
		}
		noSecret(t, cmd+" output", string(out), secrets)
	}
	out, err := exec.Command(bin, "validate", "--config", good).CombinedOutput()
	if err != nil {
		t.Errorf("validate of the good config: %v\n%s", err, out)
	}
	noSecret(t, "validate output", string(out), secrets)
}

// secret is a random string of the test's own, unlike anything else in the
// output (hex: no 'x', the mask's letter).
func secret(t *testing.T) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

func noSecret(t *testing.T, where, text string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if i := strings.Index(text, s); i >= 0 {
			line := text[strings.LastIndexByte(text[:i], '\n')+1:]
			if j := strings.IndexByte(line, '\n'); j >= 0 {
				line = line[:j]
			}
			t.Errorf("%s holds a password: %s", where, line)
		}
	}
}

// runningBinary is the sidecar binary running one config, its stderr
// collected.
type runningBinary struct {
	cmd    *exec.Cmd
	log    *lockedBuffer
	health string
}

var healthLine = regexp.MustCompile(`"msg":"health endpoints listening","addr":"([^"]+)"`)

// startBinary runs `sidecar run` on cfgPath at debug level (the most log
// lines) and waits for its health server.
func startBinary(t *testing.T, bin, cfgPath string) *runningBinary {
	t.Helper()
	return startBinaryEnv(t, bin, cfgPath)
}

// startBinaryEnv is startBinary with env ("NAME=value") added to the
// test's environment.
func startBinaryEnv(t *testing.T, bin, cfgPath string, env ...string) *runningBinary {
	t.Helper()
	r := &runningBinary{log: &lockedBuffer{}}
	r.cmd = exec.Command(bin, "run", "--config", cfgPath, "--log-level", "debug")
	r.cmd.Env = append(os.Environ(), env...)
	r.cmd.Stderr = r.log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			_ = r.cmd.Process.Kill()
			_ = r.cmd.Wait()
		}
	})
	testkit.Eventually(t, 15*time.Second, "the health server", func() bool {
		m := healthLine.FindStringSubmatch(r.log.String())
		if m != nil {
			r.health = m[1]
		}
		return m != nil
	})
	return r
}

// stop sends SIGTERM and waits for the exit.
func (r *runningBinary) stop(t *testing.T) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, r.cmd, 30*time.Second, r.log); err != nil {
		t.Logf("sidecar exited with %v", err)
	}
}

// healthBodies returns what /healthz and /readyz answer at addr.
func healthBodies(t *testing.T, addr string) (healthz, readyz string) {
	t.Helper()
	get := func(path string) string {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return resp.Status + "\n" + string(b)
	}
	return get("/healthz"), get("/readyz")
}

// journalPath is the journal.path of the config file at cfgPath.
func journalPath(t *testing.T, cfgPath string) string {
	t.Helper()
	cfg, err := loadConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Journal.Path
}

// lockedBuffer is a bytes.Buffer that a process's output can be copied into
// while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
