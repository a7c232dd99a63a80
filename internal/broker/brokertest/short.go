package brokertest

import "testing"

// SkipShort skips t under -short, naming what it needs (a broker, the
// sidecar binary): make test-short runs without either. Every helper that
// dials a broker or builds the binary calls it first, so a test that uses
// them needs no line of its own. Without -short nothing skips: a missing
// broker fails the test.
func SkipShort(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: skipped under -short", needs)
	}
}
