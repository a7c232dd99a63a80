package admin

import (
	"slices"
	"strings"
	"testing"
	"time"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/deadletter"
)

// Every REST call refuses a field or a parameter it does not know, as a
// 400 that names it, and changes nothing: a misspelt repair must not
// approve the original, a misspelt filter must not select everything.
func TestRESTRefusesWhatItDoesNotKnow(t *testing.T) {
	d := sampleDeadLetters()
	addr := serveOptions(t, Options{Token: []byte(dlToken), DeadLetters: d, TokenName: "ops", Now: func() time.Time { return t0.Add(2 * time.Hour) }})
	call := func(method, path, body string) (int, string) {
		t.Helper()
		code, out := restCall(t, addr, method, path, body, "Bearer "+dlToken)
		return code, compactJSON(out)
	}
	// A replay to look at and cancel: running, since the fake publishes
	// one a read and it has two to publish.
	if code, out := call("POST", "/v1/replays", `{"source":"orders","force":true,"states":["pending","terminated"]}`); code != 200 {
		t.Fatalf("creating the replay: %d %s", code, out)
	}
	requests := len(d.Requests())

	tests := []struct {
		rpc, name, method, path, body string
		names                         string // the unknown name the answer gives
	}{
		{"GetStatus", "status", "GET", "/v1/status?verbose=1", "", "verbose"},
		{"GetEvent", "an event", "GET", "/v1/events/orders/order-1?hop=2", "", "hop"},
		{"GetEvent", "a path parameter again", "GET", "/v1/events/orders/order-1?source=billing", "", "source"},
		{"ListDeadLetters", "list, the CLI's spelling", "GET", "/v1/deadletters?state=pending", "", "state"},
		{"ListDeadLetters", "list, a known and an unknown", "GET", "/v1/deadletters?source=orders&reasons=permanent", "", "reasons"},
		{"GetDeadLetter", "show", "GET", "/v1/deadletters/orders.dlq/3?full=1", "", "full"},
		{"ApproveDeadLetter", "approve, a misspelt repair", "POST", "/v1/deadletters/orders.dlq/3:approve", `{"reason":"x","repair_bdy":"e30="}`, "repair_bdy"},
		{"ApproveDeadLetter", "approve, a query", "POST", "/v1/deadletters/orders.dlq/3:approve?dry_run=1", `{"reason":"x"}`, "dry_run"},
		{"TerminateDeadLetter", "terminate", "POST", "/v1/deadletters/orders.dlq/3:terminate", `{"reason":"x","forever":true}`, "forever"},
		{"CreateReplay", "replay", "POST", "/v1/replays", `{"source":"orders","force":true,"sampel":3}`, "sampel"},
		{"ListReplays", "replays", "GET", "/v1/replays?state=running", "", "state"},
		{"GetReplay", "a replay", "GET", "/v1/replays/r1?watch=1", "", "watch"},
		{"CancelReplay", "cancel", "POST", "/v1/replays/r1:cancel", `{"reason":"x","now":true}`, "now"},
		{"PauseReplay", "pause", "POST", "/v1/replays/r1:pause", `{"reasn":"x"}`, "reasn"},
		{"ResumeReplay", "resume", "POST", "/v1/replays/r1:resume", `{"reason":"x","force":true}`, "force"},
		{"GetActivity", "activity", "GET", "/v1/activity?source=orders", "", "source"},
	}
	// Every call of the API has its case: a call added without one (and
	// without its check in restService) fails here.
	methods := adminv1.File_admin_v1_admin_proto.Services().ByName("Admin").Methods()
	for i := range methods.Len() {
		name := string(methods.Get(i).Name())
		if !slices.ContainsFunc(tests, func(tt struct{ rpc, name, method, path, body, names string }) bool { return tt.rpc == name }) {
			t.Errorf("no case for %s", name)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := call(tt.method, tt.path, tt.body)
			if code != 400 || !strings.Contains(out, tt.names) {
				t.Errorf("%s %s: %d %s, want 400 naming %q", tt.method, tt.path, code, out, tt.names)
			}
		})
	}
	if l, err := d.Get(deadletter.ID{Log: "orders.dlq", Partition: deadletter.NoPartition, Offset: 3}); err != nil || l.State != deadletter.Pending || len(d.Changes()) != 0 {
		t.Errorf("orders.dlq/3 is %s after refused calls, with %d changes (%v)", l.State, len(d.Changes()), err)
	}
	if n := len(d.Requests()); n != requests {
		t.Errorf("%d replays asked by refused calls", n-requests)
	}
	if code, out := call("GET", "/v1/replays/r1", ""); code != 200 || strings.Contains(out, `"state":"cancelled"`) || strings.Contains(out, `"held":true`) {
		t.Errorf("the replay after a refused cancel: %d %s", code, out)
	}
}
