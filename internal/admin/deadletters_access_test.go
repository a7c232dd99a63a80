package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/deadletter"
)

// A sidecar without dead letters says so, on both sides.
func TestDeadLettersUnavailable(t *testing.T) {
	addr := serveOptions(t, Options{Token: []byte(dlToken)})
	code, body := restCall(t, addr, "GET", "/v1/deadletters", "", "Bearer "+dlToken)
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), "no dead-letter manager") {
		t.Errorf("GET /v1/deadletters: %d %s, want 503", code, body)
	}
	c := grpcClient(t, addr)
	_, err := c.CreateReplay(authed("Bearer "+dlToken), &adminv1.CreateReplayRequest{Source: "orders"})
	if grpcstatus.Code(err) != codes.Unavailable {
		t.Errorf("CreateReplay: %v, want Unavailable", err)
	}
}

// Anonymous reads never reach dead letters, whose bodies may hold personal
// data; a wrong token changes nothing.
func TestDeadLettersNeedTheToken(t *testing.T) {
	d := sampleDeadLetters()
	addr := serveOptions(t, Options{Token: []byte(dlToken), AllowAnonymousRead: true, DeadLetters: d})
	for _, path := range []string{"/v1/deadletters", "/v1/deadletters/" + kafkaStr, "/v1%2Fdeadletters", "/v1/replays", "/v1/replays/r1"} {
		if code, body := restCall(t, addr, "GET", path, "", ""); code != http.StatusUnauthorized || len(body) != 0 {
			t.Errorf("anonymous GET %s: %d %q, want 401 and nothing", path, code, body)
		}
	}
	for _, path := range []string{"/v1/deadletters/" + kafkaStr + ":approve", "/v1/deadletters/orders.billing.dlq%2F0%2F17:terminate", "/v1/replays"} {
		for _, auth := range []string{"", "Bearer wrong"} {
			if code, _ := restCall(t, addr, "POST", path, `{"reason":"r","source":"billing"}`, auth); code != http.StatusUnauthorized {
				t.Errorf("POST %s with %q: %d, want 401", path, auth, code)
			}
		}
	}
	c := grpcClient(t, addr)
	calls := map[string]func(context.Context) error{
		"ListDeadLetters": func(ctx context.Context) error {
			_, err := c.ListDeadLetters(ctx, &adminv1.ListDeadLettersRequest{})
			return err
		},
		"GetDeadLetter": func(ctx context.Context) error {
			_, err := c.GetDeadLetter(ctx, &adminv1.GetDeadLetterRequest{Id: kafkaStr})
			return err
		},
		"ApproveDeadLetter": func(ctx context.Context) error {
			_, err := c.ApproveDeadLetter(ctx, &adminv1.ApproveDeadLetterRequest{Id: kafkaStr, Reason: "r"})
			return err
		},
		"GetReplay": func(ctx context.Context) error {
			_, err := c.GetReplay(ctx, &adminv1.GetReplayRequest{Id: "r1"})
			return err
		},
	}
	for name, call := range calls {
		if err := call(context.Background()); grpcstatus.Code(err) != codes.Unauthenticated {
			t.Errorf("anonymous %s: %v, want Unauthenticated", name, err)
		}
		if err := call(authed("Bearer wrong")); grpcstatus.Code(err) != codes.Unauthenticated {
			t.Errorf("%s with a wrong token: %v, want Unauthenticated", name, err)
		}
	}
	if ch := d.Changes(); len(ch) != 0 {
		t.Errorf("changes made without the token: %v", ch)
	}
	// The status is still open to anonymous reads.
	if code, _ := restCall(t, addr, "GET", "/v1/status", "", ""); code != http.StatusOK {
		t.Errorf("anonymous status: %d", code)
	}
}

func TestWho(t *testing.T) {
	s := &service{o: Options{TokenName: "ops"}}
	tests := []struct {
		operator, want string
		ok             bool
	}{
		{"", "ops", true},
		{"alice", "ops/alice", true},
		{"Zoë Ng", "ops/Zoë Ng", true},
		{strings.Repeat("a", MaxOperatorLen), "ops/" + strings.Repeat("a", MaxOperatorLen), true},
		{strings.Repeat("a", MaxOperatorLen+1), "", false},
		{"a\tb", "", false},
		{"a\x00", "", false},
		{"\xff", "", false},
		{"a\u2028b", "", false},
	}
	for _, tt := range tests {
		got, err := s.who(tt.operator)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("who(%q) = %q, %v; want %q, ok %v", tt.operator, got, err, tt.want, tt.ok)
		}
		if err != nil && grpcstatus.Code(err) != codes.InvalidArgument {
			t.Errorf("who(%q): %v, want InvalidArgument", tt.operator, err)
		}
	}
}

// A request's defaults: zero stays zero, for the Manager to default.
func TestReplayRequest(t *testing.T) {
	tests := []struct {
		name string
		req  *adminv1.CreateReplayRequest
		ok   bool
		want deadletter.ReplayRequest
	}{
		{"defaults", &adminv1.CreateReplayRequest{Source: "orders"}, true,
			deadletter.ReplayRequest{Filter: deadletter.Filter{Source: "orders"}}},
		{"everything", &adminv1.CreateReplayRequest{Source: "orders", Reason: "max-attempts", States: []string{"approved", "pending"},
			Since: timestamppb.New(t0), Until: timestamppb.New(t0.Add(time.Hour)), Force: true, RatePerSecond: 2.5, BatchSize: 7, Sample: 3,
			StopFailureRatio: 1, DryRun: true, Why: "w", SampleTimeout: durationpb.New(time.Second)}, true,
			deadletter.ReplayRequest{Filter: deadletter.Filter{Source: "orders", Reason: "max-attempts", States: []deadletter.State{deadletter.Approved, deadletter.Pending},
				Since: t0, Until: t0.Add(time.Hour)}, Force: true, Rate: 2.5, BatchSize: 7, Sample: 3, SampleTimeout: time.Second,
				StopFailureRatio: 1, DryRun: true, Why: "w"}},
		{"ids", &adminv1.CreateReplayRequest{Ids: []string{kafkaStr, "orders.dlq/3"}}, true,
			deadletter.ReplayRequest{IDs: []deadletter.ID{kafkaID, rabbitA}}},
		{"a bad id", &adminv1.CreateReplayRequest{Ids: []string{"x"}}, false, deadletter.ReplayRequest{}},
		{"ids and states", &adminv1.CreateReplayRequest{Ids: []string{kafkaStr}, States: []string{"approved"}}, false, deadletter.ReplayRequest{}},
		{"a negative rate", &adminv1.CreateReplayRequest{Source: "o", RatePerSecond: -1}, false, deadletter.ReplayRequest{}},
		{"a negative batch", &adminv1.CreateReplayRequest{Source: "o", BatchSize: -1}, false, deadletter.ReplayRequest{}},
		{"a negative sample", &adminv1.CreateReplayRequest{Source: "o", Sample: -1}, false, deadletter.ReplayRequest{}},
		{"a negative timeout", &adminv1.CreateReplayRequest{Source: "o", SampleTimeout: durationpb.New(-time.Second)}, false, deadletter.ReplayRequest{}},
		{"an unknown state", &adminv1.CreateReplayRequest{Source: "o", States: []string{"open"}}, false, deadletter.ReplayRequest{}},
		{"a why too long", &adminv1.CreateReplayRequest{Source: "o", Why: strings.Repeat("w", deadletter.MaxWhyLen+1)}, false, deadletter.ReplayRequest{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := replayRequest(tt.req)
			if !tt.ok {
				if grpcstatus.Code(err) != codes.InvalidArgument {
					t.Errorf("%v, want InvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(tt.want)
			if !bytes.Equal(gj, wj) {
				t.Errorf("got  %s\nwant %s", gj, wj)
			}
		})
	}
}

func TestRunProto(t *testing.T) {
	r := deadletter.Run{ID: "r1", Source: "orders", State: deadletter.RunStopped, Detail: "too many failures", CreatedBy: "ops", CreatedAt: t0,
		EndedAt: t0.Add(time.Minute), Spec: deadletter.RunSpec{IDs: []string{"orders.dlq/3"}, Rate: 10, BatchSize: 5, Sample: 2, StopFailureRatio: 0.5},
		Progress: deadletter.Progress{Selected: 10, Published: 4, Handled: 1, Failed: 3, Remaining: 6, ETA: 600 * time.Millisecond, Rate: 9.5}}
	got := runProto(&r, false)
	want := &adminv1.Replay{Id: "r1", Source: "orders", State: "stopped", Detail: "too many failures", CreatedBy: "ops", CreatedAt: timestamppb.New(t0),
		EndedAt: timestamppb.New(t0.Add(time.Minute)), RatePerSecond: 10, BatchSize: 5, Sample: 2, StopFailureRatio: 0.5,
		Progress: &adminv1.Progress{Selected: 10, Published: 4, Handled: 1, Failed: 3, Remaining: 6, Eta: durationpb.New(600 * time.Millisecond), Rate: 9.5}}
	if !proto.Equal(got, want) {
		t.Errorf("runProto =\n%v\nwant\n%v", protojson.Format(got), protojson.Format(want))
	}
	if ids := runProto(&r, true).GetIds(); len(ids) != 1 {
		t.Errorf("with ids: %v", ids)
	}
}
