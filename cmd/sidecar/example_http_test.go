package main

import (
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"handoff.dev/handoff/internal/testkit"
)

// Each HTTP example app (examples/http-go, http-node, http-python) runs as
// its README says, against the real sidecar dev --app, and does what it is
// meant to with the demo's mix: the sidecar's own account shows each order
// handled, retried then handled, deferred then handled, or dead-lettered,
// and the app's own log shows that the first order, published again with the
// same ce-id, was answered 2xx without its work done twice.
func TestDevAgainstHTTPExamples(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t) // skips under -short
	goExample := filepath.Join(t.TempDir(), "http-go")
	if out, err := exec.Command("go", "build", "-o", goExample, "../../examples/http-go").CombinedOutput(); err != nil {
		t.Fatalf("build examples/http-go: %v\n%s", err, out)
	}
	for _, tt := range []struct {
		name  string
		app   []string // the command that starts the app, without its --listen
		batch int      // --batch
	}{
		{"go", []string{goExample}, 1},
		{"node", []string{needTool(t, "node"), "../../examples/http-node/main.js"}, 1},
		{"python", []string{needTool(t, "python3"), "../../examples/http-python/main.py"}, 1},
		{"python batch", []string{needTool(t, "python3"), "../../examples/http-python/main.py"}, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			addr, appLog := startExample(t, tt.app...)
			out := runDevApp(t, bin, "http://"+addr+"/events", "--batch", strconv.Itoa(tt.batch))

			// The sidecar's account: order 1 is published twice; 3 and 8
			// (flaky) are retried once and handled; 6 (early) is deferred
			// once and handled; 5 (bad) is dead-lettered at once.
			if !strings.Contains(out, "Totals: 12 produced, 11 handled, 1 dead-lettered, 0 still in flight.") {
				t.Errorf("want 12 produced, 11 handled, 1 dead-lettered:\n%s", out)
			}
			inOrder(t, out, "order-0001  handled by the app", "order-0001  published again with the same ce-id", "order-0001  resend answered 2xx by the app")
			for _, id := range []string{"order-0003", "order-0008"} {
				inOrder(t, out, id+"  attempt 1  → overload: retried later (", id+"  handled by the app")
			}
			inOrder(t, out, "order-0006  attempt 1  → deferred: ", "order-0006  handled by the app")
			// One request per order says "HTTP 422: unknown product"; a
			// batch's result gives its detail alone.
			if !regexp.MustCompile(`order-0005  dead-lettered after 1 attempt\(s\): permanent \((HTTP 422: )?unknown product\)`).MatchString(out) {
				t.Errorf("order-0005 is not dead-lettered as permanent with the app's reason:\n%s", out)
			}

			// The app's own log: the work of each order done once, the
			// resend answered without doing it again.
			log := appLog()
			handled := regexp.MustCompile(`handled (order-\d+) \(event order-\d+, attempt (\d+)`).FindAllStringSubmatch(log, -1)
			times := map[string]int{}
			for _, m := range handled {
				times[m[1]]++
			}
			if len(times) != 11 {
				t.Errorf("the app handled %d distinct orders, want 11:\n%s", len(times), log)
			}
			for id, n := range times {
				if n != 1 {
					t.Errorf("the app did the work of %s %d times:\n%s", id, n, log)
				}
			}
			for _, want := range []string{
				"duplicate order-0001 (event order-0001): already handled, answering 200 again",
				"busy order-0003 (attempt 1): 503, Retry-After 1", "handled order-0003 (event order-0003, attempt 2,",
				"deferred order-0006 (attempt 1): payment not confirmed yet", "handled order-0006 (event order-0006, attempt 2,",
				"rejected order-0005: unknown product",
			} {
				if !strings.Contains(log, want) {
					t.Errorf("the app's log lacks %q:\n%s", want, log)
				}
			}
			if tt.batch > 1 && !regexp.MustCompile(`batch of [2-9]\d* events`).MatchString(log) {
				t.Errorf("no request carried more than one order:\n%s", log)
			}
		})
	}
}

// needTool returns the path of a program an example runs on; CI installs
// them (.ci/run), so a missing one fails the test instead of skipping it.
func needTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is needed to run the examples (apt-get install python3 nodejs): %v", name, err)
	}
	return path
}

// startExample starts an example app on a free loopback port, waits until
// it takes connections, and returns its address and a reader of its log
// that stops it first (so the log is complete).
func startExample(t *testing.T, command ...string) (addr string, log func() string) {
	t.Helper()
	addr = freeAddr(t)
	var out lockedBuffer
	app := exec.Command(command[0], append(command[1:], "--listen", addr)...)
	app.Stdout, app.Stderr = &out, &out
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = app.Wait(); close(exited) }()
	var once sync.Once
	stop := func() { once.Do(func() { _ = app.Process.Kill(); <-exited }) }
	t.Cleanup(stop)
	testkit.Eventually(t, 20*time.Second, "the example app to listen", func() bool {
		select {
		case <-exited:
			t.Fatalf("%s exited before it listened:\n%s", strings.Join(command, " "), out.String())
		default:
		}
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr, func() string { stop(); return out.String() }
}

// runDevApp runs sidecar dev --app url with the 12 orders of the demo's mix
// until every one is settled, and returns what it printed.
func runDevApp(t *testing.T, bin, url string, args ...string) string {
	t.Helper()
	var out lockedBuffer
	cmd := exec.Command(bin, append([]string{"dev", "--app", url, "--messages", "12", "--every", "20ms", "--exit-when-done"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, cmd, 60*time.Second, &out); err != nil {
		t.Fatalf("sidecar dev --app: %v\n%s", err, out.String())
	}
	return out.String()
}

// inOrder checks that out says each of says, in that order.
func inOrder(t *testing.T, out string, says ...string) {
	t.Helper()
	rest, after := out, "its start"
	for _, s := range says {
		i := strings.Index(rest, s)
		if i < 0 {
			t.Errorf("the account does not say %q after %q:\n%s", s, after, out)
			return
		}
		rest, after = rest[i+len(s):], s
	}
}
