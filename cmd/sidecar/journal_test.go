package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/testkit"
)

// sampleJournal writes a journal with hand-offs in known states and fixed
// times: a retry then success, a dead letter, and one left open mid-call.
func sampleJournal(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "handoff.db")
	j, _, err := journal.Open(path, journal.Options{Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	trail := map[string]string{"handoff-event-id": "order-1", "handoff-attempt": "1", "handoff-hops": "1"}
	write := func(k journal.Key, recs ...journal.Record) {
		if err := j.Append(context.Background(), k, recs...); err != nil {
			t.Fatal(err)
		}
	}
	k1 := journal.Key{Source: "orders", EventID: "order-1"}
	write(k1,
		journal.Record{Kind: journal.Received, At: at(0)},
		journal.Record{Kind: journal.Attempt, At: at(1), Attempt: 1},
		journal.Record{Kind: journal.Outcome, At: at(4), Attempt: 1, Outcome: 3, Status: 503, Latency: 3 * time.Millisecond, Detail: "HTTP 503: busy"},
		journal.Record{Kind: journal.Transferring, At: at(5), Hop: 1, Attempt: 1, Dest: "retry.1s", Detail: "retry", Trail: trail},
		journal.Record{Kind: journal.Transferred, At: at(9), Hop: 1, Dest: "retry.1s"},
		journal.Record{Kind: journal.Settled, At: at(10), Detail: "transferred to retry.1s"},
		journal.Record{Kind: journal.Received, At: at(1012), Hop: 1},
		journal.Record{Kind: journal.Attempt, At: at(1012), Hop: 1, Attempt: 2},
		journal.Record{Kind: journal.Outcome, At: at(1014), Hop: 1, Attempt: 2, Outcome: 1, Status: 200, Latency: 2 * time.Millisecond},
		journal.Record{Kind: journal.Settled, At: at(1015), Hop: 1, Detail: "handled"},
	)
	write(journal.Key{Source: "orders", EventID: "order-2"},
		journal.Record{Kind: journal.Received, At: at(20)},
		journal.Record{Kind: journal.Attempt, At: at(21), Attempt: 1},
		journal.Record{Kind: journal.Outcome, At: at(22), Attempt: 1, Outcome: 6, Status: 422, Latency: time.Millisecond, Detail: "HTTP 422: sku missing"},
		journal.Record{Kind: journal.Transferring, At: at(23), Hop: 1, Attempt: 1, Dest: "dlq", Detail: "dead-letter"},
		journal.Record{Kind: journal.Transferred, At: at(25), Hop: 1, Dest: "dlq"},
		journal.Record{Kind: journal.Settled, At: at(26), Detail: "transferred to dlq"},
	)
	write(journal.Key{Source: "orders", EventID: "order-3"},
		journal.Record{Kind: journal.Received, At: at(30)},
		journal.Record{Kind: journal.Attempt, At: at(31), Attempt: 1},
	)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := rootCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestJournalEventsCommand(t *testing.T) {
	path := sampleJournal(t)
	tests := []struct {
		name   string
		args   []string
		golden string
	}{
		{"all", nil, "journal_events_all.golden"},
		{"one event", []string{"--event", "order-1"}, "journal_events_one.golden"},
		{"open only", []string{"--open"}, "journal_events_open.golden"},
		{"json", []string{"--event", "order-2", "--json"}, "journal_events_json.golden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runCLI(t, append([]string{"journal", "events", "--path", path}, tt.args...)...)
			if err != nil {
				t.Fatalf("journal events: %v\n%s", err, out)
			}
			testkit.Golden(t, tt.golden, out)
		})
	}
	t.Run("since excludes old hand-offs", func(t *testing.T) {
		out, err := runCLI(t, "journal", "events", "--path", path, "--since", "1h")
		if err != nil || !strings.Contains(out, "no matching hand-offs") {
			t.Errorf("--since 1h over a journal from 2026-03-01: %v\n%s", err, out)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "nope.db")
		_, err := runCLI(t, "journal", "events", "--path", missing)
		if err == nil || !strings.Contains(err.Error(), missing) {
			t.Errorf("err = %v, want one naming %s", err, missing)
		}
		if _, statErr := os.Stat(missing); statErr == nil {
			t.Error("reading a missing journal created it")
		}
	})
}

// corrupt overwrites the middle of a journal file.
func corrupt(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 2 * 4096; i < len(b) && i < 6*4096; i++ {
		b[i] = 0xA5
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestJournalCorruptRepairReset(t *testing.T) {
	path := sampleJournal(t)
	corrupt(t, path)
	before, _ := os.ReadFile(path)

	_, _, err := journal.Open(path, journal.Options{Logger: discardLogger()})
	if err == nil {
		t.Fatal("a corrupt journal opened")
	}
	for _, want := range []string{path, "sidecar journal repair", "sidecar journal reset"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("startup error %q does not mention %q", err, want)
		}
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("opening a corrupt journal changed the file")
	}

	out, err := runCLI(t, "journal", "repair", "--path", path)
	if err != nil {
		t.Fatalf("repair: %v\n%s", err, out)
	}
	if !strings.Contains(out, "damaged journal kept at "+path+".corrupt-") {
		t.Errorf("repair output: %s", out)
	}
	j, _, err := journal.Open(path, journal.Options{Logger: discardLogger()})
	if err != nil {
		t.Fatalf("open after repair: %v", err)
	}
	j.Close()

	out, err = runCLI(t, "journal", "reset", "--path", path)
	if err != nil || !strings.Contains(out, "old journal kept at") {
		t.Fatalf("reset: %v\n%s", err, out)
	}
	j, rec, err := journal.Open(path, journal.Options{Logger: discardLogger()})
	if err != nil {
		t.Fatalf("open after reset: %v", err)
	}
	defer j.Close()
	if rec.Open != 0 {
		t.Errorf("a reset journal has %d open hand-offs", rec.Open)
	}
	aside, _ := filepath.Glob(path + ".*")
	if len(aside) != 2 {
		t.Errorf("old files kept aside: %v, want the corrupt one and the reset one", aside)
	}
}

// A record whose bytes were damaged fails its part's checksum (the
// hand-off's records of one commit): the part is shown as unreadable, and
// repair drops it and keeps the rest.
func TestJournalDamagedRecord(t *testing.T) {
	path := sampleJournal(t)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Every copy of the record's bytes: bbolt writes pages anew, so the
	// file may also hold stale ones, and the live one is among them.
	n := 0
	for i := 0; ; n++ {
		j := bytes.Index(b[i:], []byte("sku missing"))
		if j < 0 {
			break
		}
		i += j
		b[i] ^= 0xff
	}
	if n == 0 {
		t.Fatal("sample record not found in the file")
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "journal", "events", "--path", path, "--event", "order-2")
	if err != nil || !strings.Contains(out, "unreadable   journal: corrupt record: part checksum mismatch") {
		t.Errorf("events over a damaged record: %v\n%s", err, out)
	}
	out, err = runCLI(t, "journal", "repair", "--path", path)
	if err != nil || !strings.Contains(out, "12 records kept, 1 unreadable part") {
		t.Errorf("repair: %v\n%s", err, out)
	}
}

func TestJournalRepairKeepsRecords(t *testing.T) {
	path := sampleJournal(t)
	out, err := runCLI(t, "journal", "repair", "--path", path)
	if err != nil {
		t.Fatalf("repair of a healthy journal: %v\n%s", err, out)
	}
	if !strings.Contains(out, "18 records kept, 0 unreadable parts") {
		t.Errorf("repair output: %s", out)
	}
	out, err = runCLI(t, "journal", "events", "--path", path)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "journal_events_all.golden", out)
}
