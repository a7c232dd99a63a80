// Package testkit is what the project's tests share that no one package
// owns: waiting on a condition, golden files, and bbolt's consistency
// check. Broker fixtures live in broker/brokertest.
package testkit

import (
	"context"
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// maxPoll bounds the wait between two looks at a condition: conditions
// that are slow to read (a scrape, a broker query) are not read in a loop.
const maxPoll = 20 * time.Millisecond

// Eventually waits until cond holds, and fails the test when it has not
// after timeout, naming what it waited for. It looks at once, then after
// a wait that doubles from a millisecond up to maxPoll.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Wait(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Wait is Eventually for a goroutine that may not fail the test (a hook
// the code under test calls): it reports whether cond came to hold within
// timeout.
func Wait(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
		wait = min(2*wait, maxPoll)
	}
	return true
}

// ClosedAddr is a loopback address nothing listened on a moment ago: a
// connection to it is refused.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ (and the console's screenshots in docs/)")

// Update says whether the test run was asked to rewrite what it compares
// against (-update).
func Update() bool { return *update }

// Golden compares got with testdata/name, which -update rewrites.
func Golden(t testing.TB, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (run with -update if the change is right):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

// BoltConsistent opens the bbolt file at path read-only, runs bbolt's full
// check over it, and then check, if given, in the same transaction; it
// fails the test with every problem found.
func BoltConsistent(t testing.TB, path string, check func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Errorf("consistency check: open %s: %v", path, err)
		return
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() { // drain it all: the checker goroutine must end
			errs = append(errs, err)
		}
		if check != nil {
			errs = append(errs, check(tx))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		t.Errorf("consistency check of %s: %v", path, err)
	}
}

// Serve runs run (a server's Run) until the test ends, then stops it and
// fails the test if it returned an error.
func Serve(t testing.TB, run func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
