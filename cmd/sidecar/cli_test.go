package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// sidecarBinary builds the real binary once per test run; tests of the
// binary skip under -short.
func sidecarBinary(t *testing.T) string {
	t.Helper()
	brokertest.SkipShort(t, "the sidecar binary")
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "handoff-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "sidecar")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// waitExit waits up to timeout for cmd to end and returns how it ended; if it
// is still running then, it is killed and the test fails, showing out.
func waitExit(t *testing.T, cmd *exec.Cmd, timeout time.Duration, out fmt.Stringer) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s still running after %v:\n%s", filepath.Base(cmd.Path), timeout, out)
		return nil
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "handoff.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

const cliValid = `handler: {url: "http://127.0.0.1:8080/events"}
sources:
  - name: orders
    rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: orders}
retry: {max_attempts: 4, tiers: [1s, 10s]}
`

// --version names the build: its version, revision and toolchain.
func TestVersion(t *testing.T) {
	out, err := runCLI(t, "--version")
	if err != nil || !strings.HasPrefix(out, "sidecar version ") || !strings.Contains(out, runtime.Version()) {
		t.Errorf("--version: %q, %v", out, err)
	}
}

func TestValidateCommand(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	tests := []struct {
		name     string
		yaml     string
		wantCode int
		wantOut  []string
	}{
		{"valid", cliValid, 0, []string{": ok"}},
		{"missing handler url", strings.Replace(cliValid, `url: "http://127.0.0.1:8080/events"`, `timeout: 1s`, 1), 2, []string{"handler.url: required"}},
		{"bad scheme", strings.Replace(cliValid, "http://127", "ftp://127", 1), 2, []string{"handler.url: scheme \"ftp\""}},
		{"no sources", "handler: {url: \"http://127.0.0.1:8080/events\"}\n", 2, []string{"sources: at least one source"}},
		{"duplicate names", strings.Replace(cliValid, "retry:", "  - name: orders\n    rabbitmq: {url: \"amqp://x/\", queue: b}\nretry:", 1), 2, []string{"sources[1].name: duplicate"}},
		{"two brokers", strings.Replace(cliValid, "queue: orders}", "queue: orders}\n    kafka: {topic: t}", 1), 2, []string{"sources[0]: exactly one broker"}},
		{"unknown key", cliValid + "colour: blue\n", 2, []string{"colour: unknown key"}},
		{"bad duration", strings.Replace(cliValid, "tiers: [1s, 10s]", "tiers: [1s, ten]", 1), 2, []string{"retry.tiers[1]: invalid duration"}},
		{"max attempts below one", strings.Replace(cliValid, "max_attempts: 4", "max_attempts: 0", 1), 2, []string{"retry.max_attempts: must be at least 1"}},
		{"unsorted tiers", strings.Replace(cliValid, "tiers: [1s, 10s]", "tiers: [10s, 1s]", 1), 2, []string{"retry.tiers[1]: tiers must be strictly ascending"}},
		{"several problems at once", strings.Replace(strings.Replace(cliValid, "max_attempts: 4", "max_attempts: 0", 1), "tiers: [1s, 10s]", "tiers: [10s, 1s]", 1), 2,
			[]string{"2 problem(s)", "retry.max_attempts", "retry.tiers[1]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.yaml)
			out, err := exec.Command(bin, "validate", "--config", path).CombinedOutput()
			if got := exitCode(err); got != tt.wantCode {
				t.Errorf("exit code %d, want %d; output:\n%s", got, tt.wantCode, out)
			}
			for _, want := range tt.wantOut {
				if !bytes.Contains(out, []byte(want)) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "absent.yaml")
		out, err := exec.Command(bin, "validate", "--config", path).CombinedOutput()
		if exitCode(err) == 0 || !bytes.Contains(out, []byte(path)) {
			t.Errorf("exit %d, output %q: want a non-zero exit naming %s", exitCode(err), out, path)
		}
	})
	t.Run("run refuses a bad config", func(t *testing.T) {
		path := writeFile(t, strings.Replace(cliValid, "max_attempts: 4", "max_attempts: 0", 1))
		out, err := exec.Command(bin, "run", "--config", path).CombinedOutput()
		if exitCode(err) != 2 || !bytes.Contains(out, []byte("retry.max_attempts")) {
			t.Errorf("exit %d, output %q: want exit 2 naming retry.max_attempts", exitCode(err), out)
		}
	})
}

// TestRunSIGTERMDrains sends SIGTERM to the real binary with messages in
// flight: the calls in flight finish and are acked, the deliveries it holds
// but has not started go back to the queue, and it exits 0.
func TestRunSIGTERMDrains(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{time.Second})
	started := make(chan struct{}, 16)
	a := newApp(t, func(w http.ResponseWriter, _ call, _ []call) {
		started <- struct{}{}
		time.Sleep(700 * time.Millisecond)
		w.WriteHeader(http.StatusOK)
	})
	path := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 2}
sources:
  - name: drain
    rabbitmq: {url: %q, queue: %q, prefetch: 4}
retry: {tiers: [1s]}
telemetry: {metrics_listen: "127.0.0.1:0"}
admin: {listen: "127.0.0.1:0"}
shutdown: {drain_timeout: 10s}
journal: {path: %q}
`, a.url(), brokertest.RabbitURL(), q, filepath.Join(t.TempDir(), "handoff.db")))
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "run", "--config", path)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	var msgs []publishing
	for i := range 6 {
		msgs = append(msgs, publishing{MessageId: fmt.Sprintf("d-%d", i), Body: []byte("x")})
	}
	publish(t, conn, q, msgs...)
	for range 2 {
		select {
		case <-started:
		case <-time.After(15 * time.Second):
			t.Fatalf("no calls started; sidecar log:\n%s", stderr.String())
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, cmd, 15*time.Second, &stderr); err != nil {
		t.Fatalf("sidecar exited with %v after SIGTERM; log:\n%s", err, stderr.String())
	}
	calls := len(a.allCalls())
	if calls != 2 {
		t.Errorf("app called %d times, want exactly the 2 in flight at SIGTERM", calls)
	}
	testkit.Eventually(t, 5*time.Second, "the undelivered messages back in the queue", func() bool { return depth(t, conn, q) == 6-calls })
}

// TestHTTPDrainWaitsForInFlight is the preStop hook's view of
// shutdown.http_drain: GET /drain answers only once the calls in flight
// have finished and been acked and the deliveries not started are back in
// the queue; then the process exits 0. Nothing reaches the app after the
// answer, which is when Kubernetes signals the app.
func TestHTTPDrainWaitsForInFlight(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{time.Second})
	started := make(chan struct{}, 16)
	release := make(chan struct{}) // the calls in flight finish once the drain is asked for
	var finished atomic.Int32
	a := newApp(t, func(w http.ResponseWriter, _ call, _ []call) {
		started <- struct{}{}
		<-release
		finished.Add(1)
		w.WriteHeader(http.StatusOK)
	})
	path := writeFile(t, fmt.Sprintf(`handler: {url: %q, max_concurrency: 2}
sources:
  - name: drain
    rabbitmq: {url: %q, queue: %q, prefetch: 4}
retry: {tiers: [1s]}
telemetry: {metrics_listen: "127.0.0.1:0"}
shutdown: {drain_timeout: 10s, http_drain: true}
journal: {path: %q}
`, a.url(), brokertest.RabbitURL(), q, filepath.Join(t.TempDir(), "handoff.db")))
	r := startBinary(t, bin, path)
	var msgs []publishing
	for i := range 6 {
		msgs = append(msgs, publishing{MessageId: fmt.Sprintf("h-%d", i), Body: []byte("x")})
	}
	publish(t, conn, q, msgs...)
	for range 2 {
		select {
		case <-started:
		case <-time.After(15 * time.Second):
			t.Fatalf("no calls started; sidecar log:\n%s", r.log.String())
		}
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := (&http.Client{Timeout: 15 * time.Second}).Get("http://" + r.health + "/drain")
		answered <- answer{resp, err}
	}()
	testkit.Eventually(t, 10*time.Second, "the drain asked for", func() bool { return strings.Contains(r.log.String(), "drain requested") })
	select {
	case <-answered:
		t.Fatal("/drain answered with both calls still in flight")
	default:
	}
	close(release)
	ans := <-answered
	if ans.err != nil {
		t.Fatalf("GET /drain: %v; log:\n%s", ans.err, r.log.String())
	}
	resp := ans.resp
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	answeredAfter := finished.Load()
	callsAtAnswer := len(a.allCalls())
	if resp.StatusCode != http.StatusOK || string(body) != "drained\n" {
		t.Errorf("GET /drain = %d %q, want 200 drained", resp.StatusCode, body)
	}
	if answeredAfter != 2 || callsAtAnswer != 2 {
		t.Errorf("/drain answered with %d of %d calls finished, want both in-flight calls done first", answeredAfter, callsAtAnswer)
	}
	if err := waitExit(t, r.cmd, 15*time.Second, r.log); err != nil {
		t.Fatalf("sidecar exited with %v after the drain; log:\n%s", err, r.log.String())
	}
	if n := len(a.allCalls()); n != callsAtAnswer {
		t.Errorf("the app was called %d times after the drain answered", n-callsAtAnswer)
	}
	testkit.Eventually(t, 5*time.Second, "the undelivered messages back in the queue", func() bool { return depth(t, conn, q) == 6-callsAtAnswer })
}

// The run's log writes a duration as people read it, in text and in JSON.
func TestLogDurationsAsText(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var b bytes.Buffer
		opts := &slog.HandlerOptions{ReplaceAttr: durationText}
		var h slog.Handler = slog.NewTextHandler(&b, opts)
		if format == "json" {
			h = slog.NewJSONHandler(&b, opts)
		}
		slog.New(h).Info("x", "retry_in", 1500*time.Millisecond)
		if !strings.Contains(b.String(), "1.5s") || strings.Contains(b.String(), "1500000000") {
			t.Errorf("%s: %s", format, b.String())
		}
	}
}

// Every command a person runs shows examples in its help, and only run,
// whose log they set, has the log flags.
func TestEveryCommandHasExamples(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			if sub.Runnable() && strings.TrimSpace(sub.Example) == "" {
				t.Errorf("%s has no examples", sub.CommandPath())
			}
			if has := sub.Flags().Lookup("log-level") != nil; has != (sub.Name() == "run") {
				t.Errorf("%s: log flags %v", sub.CommandPath(), has)
			}
			walk(sub)
		}
	}
	walk(rootCmd())
}
