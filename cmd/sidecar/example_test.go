package main

import (
	"bytes"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"handoff.dev/handoff/internal/testkit"
)

// The gRPC example app (examples/grpc-go) runs against sidecar dev --app, as
// its README says: every order is handled or dead-lettered by its answers.
func TestDevAgainstGRPCExample(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t)
	example := filepath.Join(t.TempDir(), "grpc-go")
	if out, err := exec.Command("go", "build", "-o", example, "../../examples/grpc-go").CombinedOutput(); err != nil {
		t.Fatalf("build the example: %v\n%s", err, out)
	}
	addr := freeAddr(t)
	var appOut bytes.Buffer
	app := exec.Command(example, "-listen", addr)
	app.Stdout, app.Stderr = &appOut, &appOut
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	var stopped sync.Once
	stopApp := func() { stopped.Do(func() { _ = app.Process.Kill(); _ = app.Wait() }) }
	t.Cleanup(stopApp)
	testkit.Eventually(t, 20*time.Second, "the example app to listen", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	var out bytes.Buffer
	cmd := exec.Command(bin, "dev", "--app", "grpc://"+addr, "--messages", "12", "--every", "20ms", "--exit-when-done")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, cmd, 60*time.Second, &out); err != nil {
		t.Fatalf("sidecar dev --app: %v\n%s", err, out.String())
	}
	// Order 5 is rejected; the flaky ones (3, 8) are handled on their
	// second attempt; the rest on their first.
	if m := regexp.MustCompile(`Totals: 12 produced, 11 handled, 1 dead-lettered, 0 still in flight\.`).FindString(out.String()); m == "" {
		t.Errorf("want 12 produced, 11 handled, 1 dead-lettered:\n%s", out.String())
	}
	for _, want := range []string{"your app at grpc://" + addr, "order-0005  dead-lettered after 1 attempt(s): permanent (PERMANENT: unknown product)", "order-0003  handled by the app"} {
		if !bytes.Contains(out.Bytes(), []byte(want)) {
			t.Errorf("the account never says %q:\n%s", want, out.String())
		}
	}
	stopApp() // its log is complete, and no longer written
	if !bytes.Contains(appOut.Bytes(), []byte("order order-0003 (event order-0003, attempt 2, redelivered false) handled")) {
		t.Errorf("the app's log lacks the flaky order's second attempt:\n%s", appOut.String())
	}
	// Order 1 is published twice with the same ce-id (the demo's resend):
	// its work is done once, the resend answered without doing it again.
	if !bytes.Contains(out.Bytes(), []byte("order-0001  published again with the same ce-id")) {
		t.Errorf("the demo did not resend order 1:\n%s", out.String())
	}
	times := map[string]int{}
	for _, m := range regexp.MustCompile(`order (order-\d+) \(event order-\d+, attempt \d+, redelivered \w+\) handled`).FindAllSubmatch(appOut.Bytes(), -1) {
		times[string(m[1])]++
	}
	if len(times) != 11 {
		t.Errorf("the app handled %d distinct orders, want 11:\n%s", len(times), appOut.String())
	}
	for id, n := range times {
		if n != 1 {
			t.Errorf("the app did the work of %s %d times:\n%s", id, n, appOut.String())
		}
	}
	if !bytes.Contains(appOut.Bytes(), []byte("duplicate order-0001 (event order-0001): already handled, answering success again")) {
		t.Errorf("the app's log does not say the resend was a duplicate:\n%s", appOut.String())
	}
}
