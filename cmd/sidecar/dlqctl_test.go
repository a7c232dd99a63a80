package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/admin"
	"handoff.dev/handoff/internal/admin/admintest"
	"handoff.dev/handoff/internal/adminclient"
	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/testkit"
)

// The CLI's dead letters: two of a RabbitMQ source, one of a Kafka source
// whose id holds slashes, dead-lettered around dlqT0.
var (
	dlqT0      = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	dlqRabbitA = deadletter.ID{Log: "orders.dlq", Partition: deadletter.NoPartition, Offset: 3}
	dlqRabbitB = deadletter.ID{Log: "orders.dlq", Partition: deadletter.NoPartition, Offset: 4}
	dlqKafka   = deadletter.ID{Log: "orders.billing.dlq", Partition: 0, Offset: 17}
)

type dlqEngine struct{}

func (dlqEngine) Status() dispatch.Status { return dispatch.Status{} }

// dlqJournal holds one hand-off of every event: received, then dead-lettered.
type dlqJournal struct{}

func (dlqJournal) Stats() (journal.Stats, error) { return journal.Stats{}, nil }

func (dlqJournal) Event(_, id string) ([][]journal.Step, error) {
	return [][]journal.Step{{
		{Key: journal.Key{EventID: id}, Record: journal.Record{Kind: journal.Received, At: dlqT0.Add(-time.Minute)}},
		{Key: journal.Key{EventID: id}, Record: journal.Record{Kind: journal.Settled, At: dlqT0, Detail: "dead-lettered"}},
	}}, nil
}

// dlqServer runs a real admin server on loopback over in-memory dead
// letters, and returns its address, a token file and the dead letters.
func dlqServer(t *testing.T) (string, string, *admintest.DeadLetters) {
	t.Helper()
	d := admintest.New(func() time.Time { return dlqT0.Add(time.Hour) }, "orders", "billing")
	d.Add(deadletter.Letter{ID: dlqRabbitA, Source: "orders", EventID: "order-1", Reason: "max-attempts", Error: "HTTP 500: upstream said \x1b[31mno",
		ErrorClass: "server", Attempts: 4, Origin: "rabbitmq:orders", DeadLetteredAt: dlqT0, FirstFailureAt: dlqT0.Add(-10 * time.Minute),
		ContentType: "application/json", Headers: broker.Headers{"handoff-event-id": "order-1", "x-tenant": "acme"}},
		[]byte("{\"order\": 1,\n \"total\": \"12.50\"}"))
	d.Add(deadletter.Letter{ID: dlqRabbitB, Source: "orders", EventID: "order-2", Reason: "permanent", State: deadletter.Terminated, Attempts: 1,
		DeadLetteredAt: dlqT0.Add(time.Minute), ContentType: "application/json"}, nil)
	d.Add(deadletter.Letter{ID: dlqKafka, Source: "billing", EventID: "bill-9", Reason: "max-attempts", Attempts: 3,
		DeadLetteredAt: dlqT0.Add(-time.Minute), ContentType: "application/octet-stream", Key: []byte("k9")}, []byte{0, 1, 2, 0xff, 'a'})
	s, err := admin.Listen(admin.Options{Listen: "127.0.0.1:0", Token: []byte(adminTestToken), Engine: dlqEngine{}, Journal: dlqJournal{},
		DeadLetters: d, TokenName: "ops", Logger: discardLogger(), Now: func() time.Time { return dlqT0.Add(2 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, s.Run)
	return s.Addr(), tokenFile(t, adminTestToken, 0o600), d
}

// dlqRun runs the CLI in process and returns what it wrote to stdout and
// to stderr.
func dlqRun(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := rootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetIn(strings.NewReader(""))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// The table and the counts, a filter, and every page.
func TestDlqList(t *testing.T) {
	addr, tok, _ := dlqServer(t)
	conn := []string{"--admin", addr, "--token-file", tok}
	out, errOut, err := dlqRun(t, append([]string{"dlq", "list"}, conn...)...)
	if err != nil {
		t.Fatalf("dlq list: %v\n%s", err, errOut)
	}
	testkit.Golden(t, "dlq_list.golden", out)

	out, _, err = dlqRun(t, append([]string{"dlq", "list", "--source", "orders", "--state", "terminated,approved", "--since", "2026-03-01T12:00:30Z"}, conn...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "orders.dlq/4") || strings.Contains(out, "orders.dlq/3 ") || strings.Contains(out, "billing") {
		t.Errorf("dlq list --source orders --state terminated,approved --since …:\n%s", out)
	}

	out, _, err = dlqRun(t, append([]string{"dlq", "list", "--event-id", "bill-9"}, conn...)...)
	if err != nil || strings.Count(out, ".dlq/") != 1 || !strings.Contains(out, "orders.billing.dlq/0/17") {
		t.Errorf("dlq list --event-id bill-9: %v\n%s", err, out)
	}

	// One at a time: the first page says there is more; --all reads on.
	out, _, err = dlqRun(t, append([]string{"dlq", "list", "--limit", "1"}, conn...)...)
	if err != nil || strings.Count(out, ".dlq/") != 1 || !strings.Contains(out, "--all") {
		t.Errorf("dlq list --limit 1: %v\n%s", err, out)
	}
	out, _, err = dlqRun(t, append([]string{"dlq", "list", "--limit", "1", "--all", "-o", "json"}, conn...)...)
	if err != nil {
		t.Fatal(err)
	}
	var l adminv1.ListDeadLettersResponse
	if err := protojson.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("dlq list -o json: %v\n%s", err, out)
	}
	if len(l.GetDeadLetters()) != 3 || l.GetNextPageToken() != "" || len(l.GetCounts()) != 2 || l.GetDeadLetters()[0].GetId() != "orders.billing.dlq/0/17" {
		t.Errorf("dlq list --all -o json: %d letters, next %q, counts %v", len(l.GetDeadLetters()), l.GetNextPageToken(), l.GetCounts())
	}
}

// A dead letter in full: evidence, headers, body, repair, history and
// timeline; a body that is not text as a hex dump.
func TestDlqShow(t *testing.T) {
	addr, tok, _ := dlqServer(t)
	conn := []string{"--admin", addr, "--token-file", tok}
	if _, errOut, err := dlqRun(t, append([]string{"dlq", "approve", "orders.dlq/3", "--reason", "total fixed", "--repair-body", `{"order": 1, "total": "12.5"}`,
		"--repair-note", "decimal total", "--operator", "ann"}, conn...)...); err != nil {
		t.Fatalf("approve: %v\n%s", err, errOut)
	}
	out, errOut, err := dlqRun(t, append([]string{"dlq", "show", "orders.dlq/3"}, conn...)...)
	if err != nil {
		t.Fatalf("dlq show: %v\n%s", err, errOut)
	}
	testkit.Golden(t, "dlq_show.golden", out)

	out, _, err = dlqRun(t, append([]string{"dlq", "show", "orders.billing.dlq/0/17", "--body-limit", "4"}, conn...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"body (5 B, the first 4 B shown", "00 01 02 ff", "key            k9", "state          pending"} {
		if !strings.Contains(out, want) {
			t.Errorf("dlq show of the Kafka letter lacks %q:\n%s", want, out)
		}
	}
	out, _, err = dlqRun(t, append([]string{"dlq", "show", "orders.dlq/4"}, conn...)...)
	if err != nil || !strings.Contains(out, "the DLQ no longer holds it") {
		t.Errorf("dlq show of a letter whose body is gone: %v\n%s", err, out)
	}
	if _, _, err := dlqRun(t, append([]string{"dlq", "show", "orders.dlq/99"}, conn...)...); err == nil {
		t.Error("dlq show of an unknown letter: no error")
	}
}

// Several ids, one call each: each is reported, and one refusal fails the
// command (exit 1) without stopping the others.
func TestDlqApproveSeveralOneFailing(t *testing.T) {
	addr, tok, d := dlqServer(t)
	t.Setenv("USER", "ann")
	out, errOut, err := dlqRun(t, "dlq", "approve", "orders.billing.dlq/0/17", "orders.dlq/4", "orders.dlq/3", "--reason", "upstream fixed",
		"--admin", addr, "--token-file", tok)
	var ee *exitError
	if err == nil || errors.As(err, &ee) || !strings.Contains(err.Error(), "1 of 3 dead letters not approved") {
		t.Errorf("approve: %v, want a plain error (exit 1) saying 1 of 3 failed", err)
	}
	if want := "orders.billing.dlq/0/17: approved by ops/ann\norders.dlq/3: approved by ops/ann\n"; out != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", out, want)
	}
	if !strings.Contains(errOut, "orders.dlq/4: not approved: cannot approve a dead letter that is terminated: it is closed (FailedPrecondition)") {
		t.Errorf("stderr:\n%s", errOut)
	}
	var got []string
	for _, c := range d.Changes() {
		got = append(got, c.ID.String()+" "+c.Who+" "+c.Why)
	}
	if want := "orders.billing.dlq/0/17 ops/ann upstream fixed\norders.dlq/3 ops/ann upstream fixed"; strings.Join(got, "\n") != want {
		t.Errorf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}

	// A repaired body from a file, its content type the original's; then
	// terminate, in JSON.
	body := filepath.Join(t.TempDir(), "fixed.json")
	if err := os.WriteFile(body, []byte(`{"fixed":true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err = dlqRun(t, "dlq", "approve", "orders.dlq/3", "--reason", "again", "--repair-body-file", body, "--operator", "bo",
		"--admin", addr, "--token-file", tok)
	if err != nil || out != "orders.dlq/3: approved, with a repair of 14 B (application/json) by ops/bo\n" {
		t.Errorf("approve with a repair: %v\n%s%s", err, out, errOut)
	}
	out, _, err = dlqRun(t, "dlq", "terminate", "orders.dlq/3", "--reason", "not needed", "-o", "json", "--admin", addr, "--token-file", tok)
	var l adminv1.DeadLetter
	if err != nil || protojson.Unmarshal([]byte(out), &l) != nil || l.GetState() != "terminated" {
		t.Errorf("terminate -o json: %v\n%s", err, out)
	}
}

// A command line the CLI refuses exits 2 before asking anything.
func TestDlqAndReplayCommandLines(t *testing.T) {
	addr, tok, d := dlqServer(t)
	conn := []string{"--admin", addr, "--token-file", tok}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"approve without a reason", []string{"dlq", "approve", "orders.dlq/3"}, "--reason is required"},
		{"approve without an id", []string{"dlq", "approve", "--reason", "r"}, "requires at least 1 arg"},
		{"two repairs", []string{"dlq", "approve", "orders.dlq/3", "--reason", "r", "--repair-body", "x", "--repair-body-file", "f"}, "one or the other"},
		{"a note without a repair", []string{"dlq", "approve", "orders.dlq/3", "--reason", "r", "--repair-note", "n"}, "go with --repair-body"},
		{"a missing repair file", []string{"dlq", "approve", "orders.dlq/3", "--reason", "r", "--repair-body-file", "/nonexistent/f"}, "--repair-body-file"},
		{"an unknown state", []string{"dlq", "list", "--state", "open"}, `"open" is not a state`},
		{"a bad since", []string{"dlq", "list", "--since", "yesterday"}, "--since: want a time"},
		{"a limit too large", []string{"dlq", "list", "--limit", "5000"}, "--limit"},
		{"an unknown flag", []string{"dlq", "list", "--colour"}, "unknown flag"},
		{"a bad output", []string{"dlq", "list", "-o", "yaml"}, "--output"},
		{"replay neither ids nor source", []string{"replay", "start"}, "--source"},
		{"replay ids and a source", []string{"replay", "start", "orders.dlq/3", "--source", "orders"}, "not both"},
		{"replay a bad ratio", []string{"replay", "start", "--source", "orders", "--stop-failure-ratio", "1.5"}, "--stop-failure-ratio"},
		{"replay status without an id", []string{"replay", "status"}, "accepts 1 arg"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := dlqRun(t, append(tt.args, conn...)...)
			var ee *exitError
			if !errors.As(err, &ee) || ee.code != exitConfig || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v, want exit %d with %q", err, exitConfig, tt.want)
			}
		})
	}
	if len(d.Changes()) != 0 || len(d.Requests()) != 0 {
		t.Errorf("a refused command line reached the sidecar: %v %v", d.Changes(), d.Requests())
	}
}

// replay start --follow draws the progress on stderr until the run ends,
// then prints its summary; with -o json the final Replay.
func TestReplayStartFollow(t *testing.T) {
	adminclient.FollowEvery = time.Millisecond
	t.Cleanup(func() { adminclient.FollowEvery = 500 * time.Millisecond })
	addr, tok, d := dlqServer(t)
	conn := []string{"--admin", addr, "--token-file", tok}
	d.Add(deadletter.Letter{ID: deadletter.ID{Log: "orders.dlq", Partition: deadletter.NoPartition, Offset: 5}, Source: "orders",
		State: deadletter.Approved, DeadLetteredAt: dlqT0.Add(2 * time.Minute)}, []byte("{}"))

	// A dry run names what it would replay, and starts nothing.
	out, _, err := dlqRun(t, append([]string{"replay", "start", "--source", "orders", "--state", "pending,approved", "--force", "--dry-run"}, conn...)...)
	if err != nil || out != "dry run: would replay 2 dead letters of orders\n  orders.dlq/3\n  orders.dlq/5\n" {
		t.Errorf("replay start --dry-run: %v\n%s", err, out)
	}

	out, errOut, err := dlqRun(t, append([]string{"replay", "start", "orders.dlq/3", "orders.dlq/5", "--force",
		"--rate", "2", "--reason", "upstream fixed", "--operator", "cy", "--follow"}, conn...)...)
	if err != nil {
		t.Fatalf("replay start --follow: %v\n%s", err, errOut)
	}
	want := "replay r1 started: 2 dead letters of orders, 2/s in batches of 10, stop past 50% failures, forced\n" +
		"replay r1 completed: every selected dead letter was published\n" +
		"  published 2 of 2, handled 2, failed 0, skipped 0\n"
	if out != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", out, want)
	}
	// Standard error is not a terminal here: lines, not a bar's frames.
	if !strings.Contains(errOut, "replay r1") || !strings.Contains(errOut, "published 2 of 2, handled 2") || strings.ContainsAny(errOut, "\r█") {
		t.Errorf("no progress lines reaching 2 of 2 handled on stderr, or a bar's frames:\n%q", errOut)
	}
	reqs := d.Requests()
	if r := reqs[len(reqs)-1]; r.Who != "ops/cy" || r.Why != "upstream fixed" || !r.Force || r.Rate != 2 || len(r.IDs) != 2 {
		t.Errorf("the request: %+v", r)
	}

	out, _, err = dlqRun(t, append([]string{"replay", "start", "--source", "billing", "--state", "pending", "--follow", "-o", "json"}, conn...)...)
	var r adminv1.Replay
	if err != nil || protojson.Unmarshal([]byte(out), &r) != nil || r.GetId() != "r2" || r.GetState() != "completed" || r.GetProgress().GetPublished() != 1 {
		t.Errorf("replay start --follow -o json: %v\n%s", err, out)
	}

	out, _, err = dlqRun(t, append([]string{"replay", "list"}, conn...)...)
	if err != nil || !strings.Contains(out, "r2  billing  completed") || !strings.Contains(out, "r1  orders   completed") || !strings.Contains(out, "2/2") {
		t.Errorf("replay list: %v\n%s", err, out)
	}
	out, _, err = dlqRun(t, append([]string{"replay", "status", "r1"}, conn...)...)
	if err != nil || !strings.Contains(out, "state     completed: every selected dead letter was published") || !strings.Contains(out, "by ops/cy: upstream fixed") {
		t.Errorf("replay status: %v\n%s", err, out)
	}
	if _, _, err := dlqRun(t, append([]string{"replay", "cancel", "r1"}, conn...)...); err == nil {
		t.Error("cancel of an ended replay: no error")
	}
}

// replay pause holds a running replay and resume lets it go on; cancel
// stops it, and status --follow then ends at once.
func TestReplayCancel(t *testing.T) {
	addr, tok, _ := dlqServer(t)
	conn := []string{"--admin", addr, "--token-file", tok}
	if _, errOut, err := dlqRun(t, append([]string{"replay", "start", "orders.dlq/3", "--force"}, conn...)...); err != nil {
		t.Fatalf("replay start: %v\n%s", err, errOut)
	}
	out, _, err := dlqRun(t, append([]string{"replay", "pause", "r1", "--reason", "app being fixed", "--operator", "di"}, conn...)...)
	if err != nil || !strings.HasPrefix(out, "replay r1 running: paused by ops/di: app being fixed\n") {
		t.Errorf("replay pause: %v\n%s", err, out)
	}
	if _, _, err := dlqRun(t, append([]string{"replay", "pause", "r1"}, conn...)...); err == nil {
		t.Error("a second pause: no error")
	}
	if out, _, err = dlqRun(t, append([]string{"replay", "resume", "r1", "--operator", "di"}, conn...)...); err != nil || !strings.HasPrefix(out, "replay r1 running\n") {
		t.Errorf("replay resume: %v\n%s", err, out)
	}
	out, _, err = dlqRun(t, append([]string{"replay", "cancel", "r1", "--reason", "wrong one", "--operator", "di"}, conn...)...)
	if err != nil || out != "replay r1 cancelled: cancelled by ops/di: wrong one\n  published 0 of 1, handled 0, failed 0, skipped 0, 1 left unpublished\n" {
		t.Errorf("replay cancel: %v\n%s", err, out)
	}
	out, _, err = dlqRun(t, append([]string{"replay", "status", "r1", "--follow"}, conn...)...)
	if err != nil || !strings.HasPrefix(out, "replay r1 cancelled") {
		t.Errorf("replay status --follow: %v\n%s", err, out)
	}
}
