package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// The README's quick starts, run as written: its own commands, read from
// it (so a stale README fails here), on a fresh queue and topic. Only what
// cannot be shared on a test machine is changed: the queue, topic and group
// names, the app's port, the binaries' paths, and the journal's and
// metrics' places (through the environment the README's commands read).
func TestQuickStartsAsWritten(t *testing.T) {
	t.Parallel()
	bin := sidecarBinary(t) // skips under -short
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	app := filepath.Join(t.TempDir(), "http-go")
	if out, err := exec.Command("go", "build", "-o", app, "../../examples/http-go").CombinedOutput(); err != nil {
		t.Fatalf("build examples/http-go: %v\n%s", err, out)
	}
	for _, broker := range []string{"rabbitmq", "kafka"} {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			quickStart(t, string(readme), broker, bin, app)
		})
	}
}

// quickBlock is the sh block the README marks <!-- quickstart NAME -->.
func quickBlock(t *testing.T, readme, name string) string {
	t.Helper()
	marker := "<!-- quickstart " + name + " -->\n```sh\n"
	i := strings.Index(readme, marker)
	if i < 0 {
		t.Fatalf("the README has no block %q", marker)
	}
	body := readme[i+len(marker):]
	return body[:strings.Index(body, "```")]
}

func quickStart(t *testing.T, readme, broker, bin, app string) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "quickstart-" + broker + "-" + hex.EncodeToString(b[:])
	addr := freeAddr(t)
	swap := strings.NewReplacer("bin/sidecar", bin, "go run ./examples/http-go", app, "127.0.0.1:8080", addr,
		"queue: orders", "queue: "+name, "topic: orders", "topic: "+name, "group: orders-app", "group: "+name+"-g",
		"queue orders", "queue "+name, "topic orders", "topic "+name)
	dir := t.TempDir()
	env := append(os.Environ(), "XDG_STATE_HOME="+filepath.Join(dir, "state"), "HANDOFF_METRICS_LISTEN=127.0.0.1:0")
	sh := func(script string) *exec.Cmd {
		cmd := exec.Command("bash", "-e", "-c", swap.Replace(script))
		cmd.Dir, cmd.Env = dir, env
		return cmd
	}
	cleanUp(t, broker, name)

	// Set-up: the config, validate, declare (make is the machine's).
	var setup []string
	for _, line := range strings.Split(quickBlock(t, readme, broker+" setup"), "\n") {
		if !strings.HasPrefix(line, "make ") {
			setup = append(setup, line)
		}
	}
	out, err := sh(strings.Join(setup, "\n")).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte(": ok")) || !bytes.Contains(out, []byte(" created")) {
		t.Fatalf("set-up: %v\n%s", err, out)
	}

	// The app and the sidecar, each in its terminal.
	start := func(what string) (*exec.Cmd, *lockedBuffer) {
		var log lockedBuffer
		cmd := sh("exec " + strings.TrimSpace(quickBlock(t, readme, broker+" "+what)))
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, &log
	}
	_, appLog := start("app")
	testkit.Eventually(t, 30*time.Second, "the app listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	run, runLog := start("run")

	out, err = sh(quickBlock(t, readme, broker+" publish")).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("published 3 message(s)")) {
		t.Fatalf("publish: %v\n%s", err, out)
	}
	testkit.Eventually(t, 60*time.Second, "the app handling the three orders", func() bool {
		s := appLog.String()
		return strings.Contains(s, "handled A-1 (event order-1, attempt 1") && strings.Contains(s, "handled A-1 (event order-2, attempt 1") &&
			strings.Contains(s, "handled A-1 (event order-3, attempt 1")
	})
	t.Logf("the app said:\n%s", appLog.String())
	if err := run.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, run, 30*time.Second, runLog); err != nil {
		t.Errorf("the sidecar stopped with %v\n%s", err, runLog.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "handoff", "handoff.db")); err != nil {
		t.Errorf("the journal is not where the README says: %v", err)
	}
}

// cleanUp deletes what the quick start made on the broker when the test
// ends: the queue or topic and everything the sidecar declared beside it.
func cleanUp(t *testing.T, broker, name string) {
	switch broker {
	case "rabbitmq":
		conn := dialRabbit(t)
		t.Cleanup(func() {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			defer ch.Close()
			names := []string{name, rabbitmq.RetryQueue(name), rabbitmq.DeadLetterQueue(name), rabbitmq.LedgerQueue(name)}
			for _, d := range config.Default().Retry.Tiers {
				names = append(names, rabbitmq.TierQueue(name, d.D()))
			}
			for _, q := range names {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
		})
	case "kafka":
		brokertest.SkipShort(t, "Apache Kafka")
		t.Cleanup(func() {
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokertest.KafkaBrokers()...))
			if err != nil {
				return
			}
			defer cl.Close()
			brokertest.DropKafkaTopic(kadm.NewClient(cl), name)
		})
	}
}
