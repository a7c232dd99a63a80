package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

// drainGet asks the sidecar at addr to drain, with auth as the
// Authorization header when not empty, and returns the status.
func drainGet(t *testing.T, addr, auth string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/drain", nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("GET /drain: %v", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// The binary as the injector runs it: /drain on every interface (where the
// kubelet's preStop hook reaches it) guarded by HANDOFF_DRAIN_TOKEN. A
// request without the token, or with another, is 401 and the sidecar goes
// on consuming; the token drains it and it exits 0. Without a token, the
// same listener is refused at start.
func TestDrainTokenOnTheBinary(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	conn := dialRabbit(t)
	q := testQueue(t, conn, []time.Duration{time.Second})
	a := newApp(t, status(http.StatusOK))
	path := writeFile(t, fmt.Sprintf(`handler: {url: %q}
sources:
  - name: orders
    rabbitmq: {url: %q, queue: %q}
retry: {tiers: [1s]}
shutdown: {drain_timeout: 5s}
journal: {path: %q}
`, a.url(), brokertest.RabbitURL(), q, filepath.Join(t.TempDir(), "handoff.db")))

	// No token on a listener other hosts reach: refused, exit 2.
	cmd := exec.Command(bin, "run", "--config", path)
	cmd.Env = append(os.Environ(), "HANDOFF_HTTP_DRAIN=true", "HANDOFF_METRICS_LISTEN=0.0.0.0:0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, cmd, 15*time.Second, &stderr); exitCode(err) != 2 || !strings.Contains(stderr.String(), "HANDOFF_DRAIN_TOKEN") {
		t.Fatalf("no drain token on 0.0.0.0: exit %d, stderr %q; want 2 naming HANDOFF_DRAIN_TOKEN", exitCode(err), stderr.String())
	}

	const token = "9c1f7e2b4a6d8c0e1f3a5b7c9d0e2f4a"
	r := startBinaryEnv(t, bin, path, "HANDOFF_HTTP_DRAIN=true", "HANDOFF_METRICS_LISTEN=0.0.0.0:0", "HANDOFF_DRAIN_TOKEN="+token)
	_, port, err := net.SplitHostPort(r.health)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", port)
	publish(t, conn, q, publishing{MessageId: "before", Body: []byte("x")})
	testkit.Eventually(t, 20*time.Second, "the first message at the app", func() bool { return len(a.callsFor("before")) == 1 })

	for _, auth := range []string{"", "Bearer not-the-token-at-all-000000", "Bearer " + token[:len(token)-1], "Basic " + token} {
		if code := drainGet(t, addr, auth); code != http.StatusUnauthorized {
			t.Errorf("GET /drain with Authorization %q = %d, want 401", auth, code)
		}
	}
	// Nothing changed: still running, still consuming.
	publish(t, conn, q, publishing{MessageId: "after", Body: []byte("x")})
	testkit.Eventually(t, 20*time.Second, "a message after the refused drains at the app", func() bool { return len(a.callsFor("after")) == 1 })
	if resp, err := http.Get("http://" + addr + "/runningz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/runningz after refused drains: %v %v, want 200", resp, err)
	}
	if !strings.Contains(r.log.String(), "drain refused") || strings.Contains(r.log.String(), "drain requested") {
		t.Errorf("the log does not show the drains refused and none taken:\n%s", r.log.String())
	}
	if strings.Contains(r.log.String(), token) {
		t.Error("the log holds the drain token")
	}

	if code := drainGet(t, addr, "Bearer "+token); code != http.StatusOK {
		t.Fatalf("GET /drain with the token = %d, want 200; log:\n%s", code, r.log.String())
	}
	if err := waitExit(t, r.cmd, 20*time.Second, r.log); err != nil {
		t.Fatalf("sidecar exited with %v after the drain; log:\n%s", err, r.log.String())
	}
}
