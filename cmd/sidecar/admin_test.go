package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/testkit"
)

const adminTestToken = "s3cret-admin-token-for-tests"

// tokenFile writes token to a file of the given mode.
func tokenFile(t *testing.T, token string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(path, []byte(token+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // whatever the umask
		t.Fatal(err)
	}
	return path
}

// adminScript answers ok at once, flaky with 503 once, and parked with 429
// and Retry-After: 30, which parks its copy in the 1m tier.
func adminScript(w http.ResponseWriter, c call, prior []call) {
	switch c.Header.Get("Ce-Id") {
	case "parked":
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	default:
		contractScript(w, c, prior)
	}
}

// adminSidecar runs a sidecar on a fresh RabbitMQ queue with the admin API
// on, and returns it with the queue.
func adminSidecar(t *testing.T, script func(http.ResponseWriter, call, []call)) (*inProcess, *app, string, string) {
	t.Helper()
	conn := dialRabbit(t)
	tiers := []time.Duration{500 * time.Millisecond, time.Minute}
	queue := testQueue(t, conn, tiers)
	a := newApp(t, script)
	cfg := testConfig(a.url(), queue, tiers...)
	cfg.Admin.Listen, cfg.Admin.TokenFile = "127.0.0.1:0", tokenFile(t, adminTestToken, 0o600)
	s := startSidecar(t, cfg)
	if s.admin == "" {
		t.Fatal("the admin API is not listening")
	}
	t.Cleanup(func() { _ = conn.Close() })
	return s, a, queue, cfg.Admin.TokenFile
}

// restGet asks the REST side; auth is the Authorization header ("" for none).
func restGet(t *testing.T, addr, path, auth string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// grpcAdmin dials the gRPC side.
func grpcAdmin(t *testing.T, addr string) adminv1.AdminClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return adminv1.NewAdminClient(conn)
}

func withAuth(auth string) context.Context {
	ctx := context.Background()
	if auth == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", auth)
}

// settled waits until the journal holds no open hand-off and nothing is in
// flight.
func settled(t *testing.T, c adminv1.AdminClient) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, "every hand-off settled", func() bool {
		st, err := c.GetStatus(withAuth("Bearer "+adminTestToken), &adminv1.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st.GetJournal().GetOpen() == 0 && st.GetSources()[0].GetInFlight() == 0
	})
}

// comparable drops what changes by itself between two readings taken one
// after the other: the budget refills with time, commit timings move with
// every commit.
func comparable(st *adminv1.Status) *adminv1.Status {
	st = proto.Clone(st).(*adminv1.Status)
	st.Budget.Tokens = 0
	st.Journal.CommitP50, st.Journal.CommitMax, st.Journal.SizeBytes = nil, nil, 0
	for _, src := range st.GetSources() {
		if dl := src.GetDeadLetters(); dl != nil {
			dl.OldestOpenAge = nil // grows between two readings
		}
	}
	return st
}

// REST and gRPC give the same status and the same timelines, after a
// message was handled, one retried, and one parked in a retry tier.
func TestAdminRESTAndGRPCAgree(t *testing.T) {
	s, a, queue, _ := adminSidecar(t, adminScript)
	c := grpcAdmin(t, s.admin)
	conn := dialRabbit(t)
	publish(t, conn, queue, publishing{MessageId: "ok", Body: []byte("1")}, publishing{MessageId: "flaky", Body: []byte("2")})
	testkit.Eventually(t, 20*time.Second, "ok handled and flaky retried", func() bool {
		return len(a.callsFor("ok")) == 1 && len(a.callsFor("flaky")) == 2
	})
	settled(t, c)
	publish(t, conn, queue, publishing{MessageId: "parked", Body: []byte("3")})
	var grpcStatus *adminv1.Status
	testkit.Eventually(t, 20*time.Second, "the parked copy counted in the 1m tier", func() bool {
		st, err := c.GetStatus(withAuth("Bearer "+adminTestToken), &adminv1.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		grpcStatus = st
		tiers := st.GetSources()[0].GetRetryTiers()
		return st.GetJournal().GetOpen() == 0 && len(tiers) == 2 && tiers[1].GetKnown() && tiers[1].GetWaiting() == 1
	})

	// The status, both ways.
	var restStatus *adminv1.Status
	testkit.Eventually(t, 10*time.Second, "REST and gRPC agree on the status", func() bool {
		code, body := restGet(t, s.admin, "/v1/status", "Bearer "+adminTestToken)
		if code != http.StatusOK {
			t.Fatalf("GET /v1/status: %d %s", code, body)
		}
		restStatus = &adminv1.Status{}
		if err := protojson.Unmarshal(body, restStatus); err != nil {
			t.Fatalf("GET /v1/status: %v\n%s", err, body)
		}
		st, err := c.GetStatus(withAuth("Bearer "+adminTestToken), &adminv1.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		grpcStatus = st
		return proto.Equal(comparable(restStatus), comparable(grpcStatus))
	})
	src := grpcStatus.GetSources()[0]
	if src.GetName() != "test" || src.GetBroker() != "rabbitmq" || src.GetFrom() != queue || !src.GetConnected() {
		t.Errorf("source = %v", src)
	}
	// The parked event's Retry-After holds every call.
	if src.GetState() != "paused" || !strings.Contains(src.GetReason(), "Retry-After") || grpcStatus.GetCalls().GetOverloadUntil() == nil {
		t.Errorf("source state %q (%q), overload until %v; want paused by Retry-After", src.GetState(), src.GetReason(), grpcStatus.GetCalls().GetOverloadUntil())
	}
	if got := grpcStatus.GetJournal(); got.GetSizeBytes() == 0 || got.GetCommitMax().AsDuration() <= 0 || !strings.HasSuffix(got.GetPath(), "handoff.db") {
		t.Errorf("journal = %v", got)
	}
	if got := grpcStatus.GetCalls(); got.GetMax() != 16 || got.GetLimit() < 1 {
		t.Errorf("calls = %v", got)
	}

	// The timelines, both ways.
	for _, id := range []string{"ok", "flaky", "parked"} {
		ev, err := c.GetEvent(withAuth("Bearer "+adminTestToken), &adminv1.GetEventRequest{Source: "test", EventId: id})
		if err != nil {
			t.Fatalf("GetEvent %s: %v", id, err)
		}
		code, body := restGet(t, s.admin, "/v1/events/test/"+id, "Bearer "+adminTestToken)
		if code != http.StatusOK {
			t.Fatalf("GET /v1/events/test/%s: %d %s", id, code, body)
		}
		rest := &adminv1.Event{}
		if err := protojson.Unmarshal(body, rest); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(rest, ev) {
			t.Errorf("event %s: REST and gRPC differ:\nREST %v\ngRPC %v", id, rest, ev)
		}
		if len(ev.GetHandoffs()) != 1 {
			t.Fatalf("event %s: %d hand-offs, want 1", id, len(ev.GetHandoffs()))
		}
	}
	flaky, _ := c.GetEvent(withAuth("Bearer "+adminTestToken), &adminv1.GetEventRequest{Source: "test", EventId: "flaky"})
	var kinds, outcomes []string
	for _, st := range flaky.GetHandoffs()[0].GetSteps() {
		kinds = append(kinds, st.GetKind())
		if st.GetOutcome() != "" {
			outcomes = append(outcomes, st.GetOutcome())
		}
		if st.GetText() == "" || st.GetAt() == nil {
			t.Errorf("step without text or time: %v", st)
		}
	}
	if got := strings.Join(outcomes, ","); got != "overload,success" {
		t.Errorf("flaky outcomes = %s, want overload,success (steps %v)", got, kinds)
	}
	if !strings.Contains(strings.Join(kinds, ","), "transferred") {
		t.Errorf("flaky steps %v: no copy to a retry tier", kinds)
	}

	// An event the journal does not hold.
	if _, err := c.GetEvent(withAuth("Bearer "+adminTestToken), &adminv1.GetEventRequest{Source: "test", EventId: "nope"}); grpcstatus.Code(err) != codes.NotFound {
		t.Errorf("unknown event over gRPC: %v, want NotFound", err)
	}
	if code, _ := restGet(t, s.admin, "/v1/events/test/nope", "Bearer "+adminTestToken); code != http.StatusNotFound {
		t.Errorf("unknown event over REST: %d, want 404", code)
	}
	// The OpenAPI document is served, and open.
	code, body := restGet(t, s.admin, "/v1/openapi.json", "")
	if code != http.StatusOK || !bytes.Equal(body, adminv1.OpenAPI) {
		t.Errorf("GET /v1/openapi.json: %d, %d bytes", code, len(body))
	}
}

// Without a token, with a wrong one, with the right one: refused twice with
// nothing in the answer, then answered; the same on REST and gRPC.
func TestAdminAuth(t *testing.T) {
	s, _, _, _ := adminSidecar(t, contractScript)
	c := grpcAdmin(t, s.admin)
	tests := []struct {
		name string
		auth string
		ok   bool
	}{
		{"no token", "", false},
		{"wrong token", "Bearer not-the-token", false},
		{"right token", "Bearer " + adminTestToken, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// With the right token: the status, and 404 for an event the
			// journal does not hold.
			for path, answered := range map[string]int{"/v1/status": http.StatusOK, "/v1/events/test/x": http.StatusNotFound} {
				code, body := restGet(t, s.admin, path, tt.auth)
				switch {
				case tt.ok && code != answered:
					t.Errorf("GET %s: %d with the right token, want %d", path, code, answered)
				case !tt.ok && (code != http.StatusUnauthorized || len(body) != 0):
					t.Errorf("GET %s: %d %q, want 401 and nothing else", path, code, body)
				}
			}
			_, err := c.GetStatus(withAuth(tt.auth), &adminv1.GetStatusRequest{})
			switch {
			case tt.ok && err != nil:
				t.Errorf("GetStatus: %v", err)
			case !tt.ok:
				st, _ := grpcstatus.FromError(err)
				if st.Code() != codes.Unauthenticated || st.Message() != "" {
					t.Errorf("GetStatus: %v, want Unauthenticated and nothing else", err)
				}
			}
			_, err = c.GetEvent(withAuth(tt.auth), &adminv1.GetEventRequest{Source: "test", EventId: "x"})
			if want := codes.Unauthenticated; tt.ok {
				want = codes.NotFound
				if grpcstatus.Code(err) != want {
					t.Errorf("GetEvent: %v, want %v", err, want)
				}
			} else if grpcstatus.Code(err) != want {
				t.Errorf("GetEvent: %v, want %v", err, want)
			}
		})
	}
}

// A token file that others can read stops the sidecar at start, with the
// file and its mode named, and exit code 2; validate refuses it the same way.
func TestAdminTokenFileReadableByOthers(t *testing.T) {
	bin := sidecarBinary(t)
	tok := tokenFile(t, adminTestToken, 0o644)
	cfg := writeFile(t, cliValid+"admin: {listen: \"127.0.0.1:0\", token_file: \""+tok+"\"}\njournal: {path: \""+filepath.Join(t.TempDir(), "j.db")+"\"}\n")
	for _, verb := range []string{"run", "validate"} {
		t.Run(verb, func(t *testing.T) {
			var out bytes.Buffer
			cmd := exec.Command(bin, verb, "--config", cfg)
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			err := waitExit(t, cmd, 30*time.Second, &out)
			if code := exitCode(err); code != 2 {
				t.Fatalf("exit code %d, want 2:\n%s", code, &out)
			}
			for _, want := range []string{tok, "0644", "chmod 600"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, &out)
				}
			}
		})
	}
}

// sidecar status and sidecar events ask a running sidecar, in text and JSON.
func TestAdminCLI(t *testing.T) {
	s, a, queue, tok := adminSidecar(t, contractScript)
	conn := dialRabbit(t)
	publish(t, conn, queue, publishing{MessageId: "flaky", Body: []byte("1")})
	testkit.Eventually(t, 20*time.Second, "flaky handled", func() bool { return len(a.callsFor("flaky")) == 2 })
	settled(t, grpcAdmin(t, s.admin))

	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := rootCmd()
		cmd.SetArgs(args)
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	out, err := run("status", "--admin", s.admin, "--token-file", tok)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	for _, want := range []string{"ready     yes", "calls     0 in flight, limit", "source test (rabbitmq " + queue + ")", "connected, consuming",
		"retry " + queue + ".retry.500ms (500ms): 0 waiting", "journal   "} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	out, err = run("status", "--admin", s.admin, "--token-file", tok, "--output", "json")
	if err != nil {
		t.Fatalf("status --output json: %v\n%s", err, out)
	}
	var st adminv1.Status
	if err := protojson.Unmarshal([]byte(out), &st); err != nil || st.GetSources()[0].GetName() != "test" {
		t.Errorf("status --output json: %v\n%s", err, out)
	}

	out, err = run("events", "test", "flaky", "--admin", s.admin, "--token-file", tok)
	if err != nil {
		t.Fatalf("events: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if lines[0] != "test/flaky" {
		t.Errorf("events: first line %q, want test/flaky", lines[0])
	}
	for _, want := range []string{"received     hop 0", "attempt 1    overload, answered in", "transferred  hop 1 → retry.500ms: confirmed", "attempt 2    success, answered in", "settled      hop 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("events lacks %q:\n%s", want, out)
		}
	}
	out, err = run("events", "test", "flaky", "--admin", s.admin, "--token-file", tok, "-o", "json")
	if err != nil {
		t.Fatalf("events -o json: %v\n%s", err, out)
	}
	var ev map[string]any
	if err := json.Unmarshal([]byte(out), &ev); err != nil || ev["eventId"] != "flaky" {
		t.Errorf("events -o json: %v\n%s", err, out)
	}

	// Refused without the token; an unknown event is an error.
	if out, err := run("status", "--admin", s.admin); grpcstatus.Code(err) != codes.Unauthenticated {
		t.Errorf("status without a token: %v\n%s", err, out)
	}
	if out, err := run("events", "test", "nope", "--admin", s.admin, "--token-file", tok); grpcstatus.Code(err) != codes.NotFound {
		t.Errorf("events of an unknown event: %v\n%s", err, out)
	}
}

// On a Kafka source the status names the topic and counts, per retry tier,
// the group's lag: the parked copy waits in the 1m tier.
func TestAdminStatusKafka(t *testing.T) {
	brokertest.SkipShort(t, "a sidecar")
	topic := "admin-status"
	brokers := kafkaCluster(t, topic, 1)
	a := newApp(t, adminScript)
	cfg := kafkaConfig(a.url(), brokers, topic, 500*time.Millisecond, time.Minute)
	cfg.Admin.Listen, cfg.Admin.TokenFile = "127.0.0.1:0", tokenFile(t, adminTestToken, 0o600)
	s := startSidecar(t, cfg)
	c := grpcAdmin(t, s.admin)
	produceKafka(t, brokers, &kgo.Record{Topic: topic, Value: []byte("1"), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte("parked")}}})
	var st *adminv1.Status
	testkit.Eventually(t, 20*time.Second, "the parked copy counted in the 1m tier", func() bool {
		var err error
		st, err = c.GetStatus(withAuth("Bearer "+adminTestToken), &adminv1.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		tiers := st.GetSources()[0].GetRetryTiers()
		return len(tiers) == 2 && tiers[1].GetKnown() && tiers[1].GetWaiting() == 1
	})
	src := st.GetSources()[0]
	if src.GetBroker() != "kafka" || src.GetFrom() != topic || !src.GetConnected() {
		t.Errorf("source %v", src)
	}
	if got, want := src.GetRetryTiers()[1].GetName(), topic+"."+kafkaGroup(topic)+".retry.1m"; got != want {
		t.Errorf("tier %q, want %q", got, want)
	}
	ev, err := c.GetEvent(withAuth("Bearer "+adminTestToken), &adminv1.GetEventRequest{Source: "test", EventId: "parked"})
	if err != nil || len(ev.GetHandoffs()) != 1 {
		t.Fatalf("GetEvent: %v, %v", ev, err)
	}
}

// validate says when the admin API is off, as a notice: the file is valid.
func TestValidateSaysTheAdminAPIIsOff(t *testing.T) {
	tok := tokenFile(t, adminTestToken, 0o600)
	tests := []struct {
		name   string
		admin  string
		notice bool
	}{
		{"no token", "admin: {listen: \"127.0.0.1:9400\"}\n", true},
		{"a token", "admin: {listen: \"127.0.0.1:9400\", token_file: \"" + tok + "\"}\n", false},
		{"anonymous reads", "admin: {listen: \"127.0.0.1:9400\", allow_anonymous_read: true}\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			cmd := rootCmd()
			cmd.SetArgs([]string{"validate", "--config", writeFile(t, cliValid+tt.admin)})
			cmd.SetOut(&out)
			if err := cmd.ExecuteContext(context.Background()); err != nil {
				t.Fatalf("validate: %v\n%s", err, &out)
			}
			if got := strings.Contains(out.String(), "notice: admin API off"); got != tt.notice {
				t.Errorf("notice %v, want %v:\n%s", got, tt.notice, &out)
			}
		})
	}
}
