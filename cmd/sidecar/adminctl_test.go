package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"handoff.dev/handoff/internal/testkit"
)

// adminConfig writes a sidecar config whose admin API listens on listen
// with the token in tokenFile.
func adminConfig(t *testing.T, listen, tokenFile string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "handoff.yaml")
	yaml := fmt.Sprintf(`handler: {url: "http://127.0.0.1:8080/events"}
sources:
  - name: orders
    rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: orders}
admin: {listen: %q, token_file: %q}
`, listen, tokenFile)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The admin commands find the sidecar as it is configured: from --config,
// from a sidecar container's environment, or from their flags, which win.
func TestAdminCommandsFindTheSidecar(t *testing.T) {
	addr, tok, _ := dlqServer(t)
	_, port, _ := net.SplitHostPort(addr)
	ok := func(what string, args ...string) {
		t.Helper()
		if out, errOut, err := dlqRun(t, append([]string{"status"}, args...)...); err != nil || !strings.Contains(out, "ready") {
			t.Errorf("%s: %v\n%s%s", what, err, out, errOut)
		}
	}
	ok("--config", "--config", adminConfig(t, addr, tok))
	ok("--config, a listener on every interface", "--config", adminConfig(t, "0.0.0.0:"+port, tok))

	t.Setenv("HANDOFF_ADMIN_LISTEN", ":"+port)
	t.Setenv("HANDOFF_ADMIN_TOKEN", adminTestToken+"\n")
	ok("the sidecar container's environment")

	// A flag wins over the environment.
	if _, _, err := dlqRun(t, "status", "--admin", testkit.ClosedAddr(t)); err == nil {
		t.Error("--admin of a closed port answered: the environment won over the flag")
	}
}

// What the admin commands say when the API refuses them or is not there:
// what to check, not gRPC's words (golden).
func TestAdminCommandsSayWhatToCheck(t *testing.T) {
	addr, _, _ := dlqServer(t)
	closed := testkit.ClosedAddr(t)
	wrong := tokenFile(t, "not-the-sidecars-token", 0o600)
	var b strings.Builder
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"no token", []string{"status", "--admin", addr}},
		{"the wrong token", []string{"dlq", "list", "--admin", addr, "--token-file", wrong}},
		{"the wrong token, from a config", []string{"replay", "list", "--config", adminConfig(t, addr, wrong)}},
		{"nothing listening", []string{"status", "--admin", closed, "--token-file", wrong}},
	} {
		_, _, err := dlqRun(t, tt.args...)
		if err == nil {
			t.Fatalf("%s: no error", tt.name)
		}
		said := lastWord(err)
		said = strings.NewReplacer(addr, "ADDR", closed, "CLOSED", wrong, "TOKEN_FILE").Replace(said)
		if i := strings.Index(said, "; connection error"); i >= 0 {
			said = said[:i] + "; connection error: …" + said[strings.LastIndex(said, " ("):]
		}
		fmt.Fprintf(&b, "%s:\n  %s\n", tt.name, said)
	}
	testkit.Golden(t, "admin_errors.golden", b.String())
}
