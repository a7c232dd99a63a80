package main

import (
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"handoff.dev/handoff/internal/testkit"
)

// sidecar dev runs the real pipeline on kfake and accounts for every order,
// with the demo app over HTTP or over gRPC: the same answers, the same fate.
func TestDevAccountsForEveryOrder(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		handler string
		share   bool
		says    []string
	}{
		{"http", false, []string{"503 busy", "attempt 2  → 200 handled", "dead-lettered after 1 attempt(s): permanent (HTTP 422: unknown product)"}},
		{"grpc", false, []string{"RESOURCE_EXHAUSTED busy", "attempt 2  → OK handled", "dead-lettered after 1 attempt(s): permanent (PERMANENT: unknown product)",
			"(gRPC INTERNAL: database error)"}},
		{"http", true, []string{"Consumed through the share group demo", "503 busy", "attempt 2  → 200 handled",
			"dead-lettered after 1 attempt(s): permanent (HTTP 422: unknown product)"}},
	} {
		name := tt.handler
		if tt.share {
			name += " share group"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bin := sidecarBinary(t)
			var out bytes.Buffer
			args := []string{"dev", "--handler", tt.handler, "--messages", "24", "--every", "20ms", "--exit-when-done"}
			if tt.share {
				args = append(args, "--share-group")
			}
			cmd := exec.Command(bin, args...)
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if err := waitExit(t, cmd, 60*time.Second, &out); err != nil {
				t.Fatalf("sidecar dev: %v\n%s", err, out.String())
			}
			m := regexp.MustCompile(`Totals: (\d+) produced, (\d+) handled, (\d+) dead-lettered, (\d+) still in flight`).FindStringSubmatch(out.String())
			if m == nil {
				t.Fatalf("no totals line:\n%s", out.String())
			}
			n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
			// Orders 5 and 15 (rejected) and 11 and 23 (always failing) are
			// dead letters; the rest succeed.
			if n(1) != 24 || n(2) != 20 || n(3) != 4 || n(4) != 0 {
				t.Errorf("totals = %s, want 24 produced, 20 handled, 4 dead-lettered, 0 in flight\n%s", m[0], out.String())
			}
			for _, want := range append(tt.says, "dead-lettered after 4 attempt(s): max-attempts") {
				if !bytes.Contains(out.Bytes(), []byte(want)) {
					t.Errorf("the account never says %q", want)
				}
			}
		})
	}
}

// Ctrl-C stops the demo cleanly: exit 0, with the totals printed.
func TestDevStopsOnInterrupt(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	var out lockedBuffer
	cmd := exec.Command(bin, "dev", "--messages", "1000", "--every", "50ms")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // should the wait below fail
	// Ctrl-C once the demo is running: an order has been handled.
	testkit.Eventually(t, 60*time.Second, "the first order handled", func() bool { return strings.Contains(out.String(), "handled") })
	// The console it names is there, and shows the demo's dead letters.
	m := regexp.MustCompile(`Console at (http://\S+/ui/) \(token ([0-9a-f]+),`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no console line:\n%s", out.String())
	}
	if resp, err := http.Get(m[1]); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %v %v", m[1], resp, err)
	} else {
		resp.Body.Close()
	}
	testkit.Eventually(t, 30*time.Second, "the demo's dead letter in the console's list", func() bool {
		req, _ := http.NewRequest("GET", strings.TrimSuffix(m[1], "/ui/")+"/v1/deadletters", nil)
		req.Header.Set("Authorization", "Bearer "+m[2])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && strings.Contains(string(body), `"eventId":"order-0005"`)
	})
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, cmd, 20*time.Second, &out); err != nil {
		t.Errorf("sidecar dev exited with %v after Ctrl-C\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "Totals: ") {
		t.Errorf("no totals after Ctrl-C:\n%s", out.String())
	}
}
