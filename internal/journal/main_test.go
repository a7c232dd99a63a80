package journal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// openResult is what a child process saw when it opened a damaged file.
type openResult struct {
	Err      string
	Panicked bool
	Corrupt  bool
	Path     string
	HasCause bool
	Recovery string
	Leaked   string
	// Crashed is set by the parent: the child died (a fault in bbolt's
	// mmap is fatal, not a panic) and this is the start of what it printed.
	Crashed string
}

// childOpenEnv names the file a child process of this test binary opens.
const childOpenEnv = "JOURNAL_TEST_CHILD_OPEN"

func TestMain(m *testing.M) {
	if path := os.Getenv(childOpenEnv); path != "" {
		childOpen(path)
		os.Exit(0)
	}
	code := m.Run()
	for _, dir := range benchDirs {
		_ = os.RemoveAll(dir)
	}
	os.Exit(code)
}

// benchDirs are directories benchmarks share across their runs, removed
// when the test binary ends.
var benchDirs []string

// childOpen opens path, prints an openResult as JSON and returns.
func childOpen(path string) {
	var res openResult
	goroutines := runtime.NumGoroutine()
	j, rec, err := openNoPanic(path)
	if err == nil {
		res.Recovery = rec.String()
		_ = j.Close()
	} else {
		res.Err = err.Error()
		res.Panicked = strings.HasPrefix(res.Err, "Open panicked")
		var ce *CorruptError
		if errors.As(err, &ce) {
			res.Corrupt, res.Path, res.HasCause = true, ce.Path, ce.Unwrap() != nil
		}
	}
	// A failed Open leaves nothing running (bbolt's checker included). The
	// wait ends as soon as the count is back; it is long only so that a
	// loaded machine cannot pass for a leak.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if runtime.NumGoroutine() > goroutines {
		buf := make([]byte, 1<<16)
		res.Leaked = string(buf[:runtime.Stack(buf, true)])
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
}

// openInChild opens path in a child process, so that a fatal fault while
// reading a damaged file fails one subtest instead of the whole binary.
func openInChild(t *testing.T, path string) openResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childOpenEnv+"="+path)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var res openResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil || runErr != nil {
		out := stderr.String()
		if len(out) > 1500 {
			out = out[:1500] + "\n…"
		}
		return openResult{Crashed: fmt.Sprintf("%v\n%s", runErr, out)}
	}
	return res
}

// openNoPanic turns a panic in Open into an error, so that one damaged
// file fails its subtest instead of the whole test binary.
func openNoPanic(path string) (j *Journal, rec Recovery, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("Open panicked: %v", r)
		}
	}()
	return Open(path, testOptions(Options{}))
}
