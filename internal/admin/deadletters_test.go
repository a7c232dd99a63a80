package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/admin/admintest"
	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/testkit"
)

var _ DeadLetters = (*admintest.DeadLetters)(nil)

const dlToken = "dl-token"

// The dead letters every test here starts from: two of a RabbitMQ source,
// one of a Kafka source, whose id holds slashes.
var (
	t0       = time.Date(2030, 5, 6, 7, 0, 0, 0, time.UTC)
	rabbitA  = deadletter.ID{Log: "orders.dlq", Partition: deadletter.NoPartition, Offset: 3}
	rabbitB  = deadletter.ID{Log: "orders.dlq", Partition: deadletter.NoPartition, Offset: 4}
	kafkaID  = deadletter.ID{Log: "orders.billing.dlq", Partition: 0, Offset: 17}
	kafkaStr = "orders.billing.dlq/0/17"
)

func sampleDeadLetters() *admintest.DeadLetters {
	d := admintest.New(func() time.Time { return t0.Add(time.Hour) }, "orders", "billing")
	d.Add(deadletter.Letter{ID: rabbitA, Source: "orders", EventID: "order-1", Reason: "max-attempts", Error: "HTTP 500",
		Attempts: 4, DeadLetteredAt: t0, ContentType: "application/json", Headers: broker.Headers{"handoff-event-id": "order-1"}},
		[]byte(`{"order":1}`))
	d.Add(deadletter.Letter{ID: rabbitB, Source: "orders", EventID: "order-2", Reason: "permanent", State: deadletter.Terminated,
		DeadLetteredAt: t0.Add(time.Minute), ContentType: "application/json"}, nil)
	d.Add(deadletter.Letter{ID: kafkaID, Source: "billing", EventID: "bill-9", Reason: "max-attempts", Attempts: 3,
		DeadLetteredAt: t0.Add(-time.Minute), ContentType: "text/plain", Key: []byte("k9")}, bytes.Repeat([]byte("x"), 100))
	return d
}

// eventJournal answers every event with one received step.
type eventJournal struct{ fakeJournal }

func (eventJournal) Event(source, id string) ([][]journal.Step, error) {
	return [][]journal.Step{{{Key: journal.Key{EventID: id}, Record: journal.Record{Kind: journal.Received, At: t0}}}}, nil
}

// syncBuffer is a log's destination, read while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serveOptions runs a server with o on loopback until the test ends.
func serveOptions(t *testing.T, o Options) string {
	t.Helper()
	o.Listen = "127.0.0.1:0"
	if o.Engine == nil {
		o.Engine = fakeEngine{}
	}
	if o.Journal == nil {
		o.Journal = eventJournal{}
	}
	s, err := Listen(o)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, s.Run)
	return s.Addr()
}

// restCall sends one REST call with the token and returns its status and
// body.
func restCall(t *testing.T, addr, method, path, body, auth string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+addr+path, rd)
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
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func grpcClient(t *testing.T, addr string) adminv1.AdminClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return adminv1.NewAdminClient(conn)
}

func authed(auth string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", auth)
}

// Every dead-letter and replay call over REST: the route, an id with
// slashes as it is and escaped, the error codes as HTTP statuses, and who
// the ledger records.
func TestDeadLettersREST(t *testing.T) {
	d := sampleDeadLetters()
	d.FailApply(rabbitB, errors.New("ledger append: broker said no to amqp://user:pw@host"))
	logs := &syncBuffer{}
	addr := serveOptions(t, Options{Token: []byte(dlToken), DeadLetters: d, TokenName: "ops",
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Now: func() time.Time { return t0.Add(2 * time.Hour) }})

	tests := []struct {
		name         string
		method, path string
		body         string
		code         int
		has          []string // pieces of the answer
		hasNot       []string
	}{
		{name: "list", method: "GET", path: "/v1/deadletters", code: 200,
			has:    []string{`"id":"orders.billing.dlq/0/17"`, `"id":"orders.dlq/3"`, `"id":"orders.dlq/4"`, `"source":"billing"`, `"open":"1"`, `"oldestOpenAge":"7260s"`, `"terminated":"1"`},
			hasNot: []string{`"body"`, `"history"`, `"nextPageToken":"`}},
		{name: "list by source and state", method: "GET", path: "/v1/deadletters?source=orders&states=pending", code: 200,
			has: []string{`"id":"orders.dlq/3"`, `"oldestOpenAge":"7200s"`}, hasNot: []string{`orders.dlq/4`, `"source":"billing"`}},
		{name: "list a page", method: "GET", path: "/v1/deadletters?pageSize=1", code: 200,
			has: []string{`"id":"orders.billing.dlq/0/17"`, `"nextPageToken":"orders.billing.dlq/0/17"`}, hasNot: []string{`orders.dlq/3`}},
		{name: "list the next page", method: "GET", path: "/v1/deadletters?pageSize=1&pageToken=orders.billing.dlq%2F0%2F17", code: 200,
			has: []string{`"id":"orders.dlq/3"`, `"nextPageToken":"orders.dlq/3"`}, hasNot: []string{`"id":"orders.billing.dlq/0/17"`}},
		{name: "list by time", method: "GET", path: "/v1/deadletters?since=2030-05-06T07:00:30Z", code: 200,
			has: []string{`orders.dlq/4`}, hasNot: []string{`"id":"orders.dlq/3"`, `"id":"orders.billing.dlq/0/17"`}},
		{name: "list an unknown source", method: "GET", path: "/v1/deadletters?source=nope", code: 404, has: []string{"no such source"}},
		{name: "list an unknown state", method: "GET", path: "/v1/deadletters?states=lost", code: 400, has: []string{`\"lost\" is not a state`}},
		{name: "list a bad page token", method: "GET", path: "/v1/deadletters?pageToken=nope", code: 400, has: []string{"not a dead-letter id"}},
		{name: "list backwards", method: "GET", path: "/v1/deadletters?since=2030-05-06T08:00:00Z&until=2030-05-06T07:00:00Z", code: 400},

		{name: "show, slashes as they are", method: "GET", path: "/v1/deadletters/" + kafkaStr, code: 200,
			has: []string{`"id":"orders.billing.dlq/0/17"`, `"body":"eHh4`, `"key":"azk="`, `"handoffs":[`, `"eventId":"bill-9"`}, hasNot: []string{`bodyTruncated`}},
		{name: "show, slashes escaped", method: "GET", path: "/v1/deadletters/orders.billing.dlq%2F0%2F17", code: 200, has: []string{`"id":"orders.billing.dlq/0/17"`}},
		{name: "show, body cut", method: "GET", path: "/v1/deadletters/" + kafkaStr + "?bodyLimit=2", code: 200, has: []string{`"body":"eHg="`, `"bodyTruncated":true`}},
		{name: "show, body gone", method: "GET", path: "/v1/deadletters/orders.dlq/4", code: 200, has: []string{`"bodyError":"the DLQ no longer holds it`}},
		{name: "show an unknown id", method: "GET", path: "/v1/deadletters/orders.dlq/99", code: 404},
		{name: "show a bad id", method: "GET", path: "/v1/deadletters/orders/x", code: 400, has: []string{"not a dead-letter id"}},
		{name: "show a negative body limit", method: "GET", path: "/v1/deadletters/orders.dlq/3?bodyLimit=-1", code: 400},

		{name: "replay a pending one unforced", method: "POST", path: "/v1/replays", body: `{"ids":["orders.billing.dlq/0/17"]}`, code: 400,
			has: []string{"approve it first"}},
		{name: "approve without a reason", method: "POST", path: "/v1/deadletters/" + kafkaStr + ":approve", body: `{}`, code: 400, has: []string{"reason is required"}},
		{name: "approve, a blank reason", method: "POST", path: "/v1/deadletters/" + kafkaStr + ":approve", body: `{"reason":"  "}`, code: 400},
		{name: "approve, a note without a repair", method: "POST", path: "/v1/deadletters/" + kafkaStr + ":approve", body: `{"reason":"r","repairNote":"n"}`, code: 400},
		{name: "approve, an operator with a newline", method: "POST", path: "/v1/deadletters/" + kafkaStr + ":approve", body: `{"reason":"r","operator":"a\nb"}`, code: 400, has: []string{"operator"}},
		{name: "approve, escaped, with a repair", method: "POST", path: "/v1/deadletters/orders.billing.dlq%2F0%2F17:approve",
			body: `{"reason":"schema fixed upstream","operator":"alice","repairBody":"eyJmaXhlZCI6dHJ1ZX0=","repairNote":"added the field"}`, code: 200,
			has: []string{`"state":"approved"`, `"who":"ops/alice"`, `"repair":{"body":"eyJmaXhlZCI6dHJ1ZX0=","contentType":"text/plain","note":"added the field"}`, `"why":"schema fixed upstream"`}},
		{name: "approve again, as it is", method: "POST", path: "/v1/deadletters/" + kafkaStr + ":approve", body: `{"reason":"no repair after all"}`, code: 200,
			has: []string{`"who":"ops"`, `"why":"no repair after all"`}},
		{name: "terminate", method: "POST", path: "/v1/deadletters/orders.dlq/3:terminate", body: `{"reason":"a test order","operator":"bob"}`, code: 200,
			has: []string{`"state":"terminated"`, `"who":"ops/bob"`}},
		{name: "approve a terminated one", method: "POST", path: "/v1/deadletters/orders.dlq/3:approve", body: `{"reason":"r"}`, code: 400,
			has: []string{"cannot approve a dead letter that is terminated: it is closed"}},
		{name: "terminate without a reason", method: "POST", path: "/v1/deadletters/orders.dlq/3:terminate", body: `{}`, code: 400},
		{name: "approve an unknown one", method: "POST", path: "/v1/deadletters/orders.dlq/99:approve", body: `{"reason":"r"}`, code: 404},
		{name: "an internal failure says nothing of it", method: "POST", path: "/v1/deadletters/orders.dlq/4:approve", body: `{"reason":"r"}`, code: 500,
			has: []string{"approving a dead letter failed; the sidecar's log says why"}, hasNot: []string{"broker said no", "amqp"}},

		{name: "replay by id", method: "POST", path: "/v1/replays", body: `{"ids":["orders.billing.dlq/0/17"],"why":"fixed","operator":"carol"}`, code: 200,
			has: []string{`"id":"r1"`, `"state":"running"`, `"createdBy":"ops/carol"`, `"ids":["orders.billing.dlq/0/17"]`, `"ratePerSecond":10`, `"selected":"1"`}},
		{name: "replay, a dry run", method: "POST", path: "/v1/replays", body: `{"source":"billing","dryRun":true}`, code: 200,
			has: []string{`"dryRun":true`, `"ids":["orders.billing.dlq/0/17"]`}, hasNot: []string{`"id":"r`}},
		{name: "replay ids of two sources", method: "POST", path: "/v1/replays", body: `{"ids":["orders.billing.dlq/0/17","orders.dlq/3"],"force":true}`, code: 400,
			has: []string{"different sources"}},
		{name: "replay, ids and a source", method: "POST", path: "/v1/replays", body: `{"ids":["orders.dlq/3"],"source":"orders"}`, code: 400},
		{name: "replay, neither", method: "POST", path: "/v1/replays", body: `{}`, code: 400},
		{name: "replay, a bad ratio", method: "POST", path: "/v1/replays", body: `{"source":"orders","stopFailureRatio":2}`, code: 400},
		{name: "replay, an unknown source", method: "POST", path: "/v1/replays", body: `{"source":"nope"}`, code: 404},
		{name: "a replay", method: "GET", path: "/v1/replays/r1", code: 200, has: []string{`"id":"r1"`, `"published":"1"`, `"state":"completed"`}},
		{name: "replays", method: "GET", path: "/v1/replays", code: 200, has: []string{`"id":"r1"`}, hasNot: []string{`"ids"`}},
		{name: "replays of an unknown source", method: "GET", path: "/v1/replays?source=nope", code: 404},
		{name: "an unknown replay", method: "GET", path: "/v1/replays/r9", code: 404},
		{name: "cancel an ended replay", method: "POST", path: "/v1/replays/r1:cancel", body: `{"reason":"enough"}`, code: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := restCall(t, addr, tt.method, tt.path, tt.body, "Bearer "+dlToken)
			compact := compactJSON(body)
			if code != tt.code {
				t.Fatalf("%s %s: %d %s, want %d", tt.method, tt.path, code, body, tt.code)
			}
			for _, want := range tt.has {
				if !strings.Contains(compact, want) {
					t.Errorf("answer lacks %s:\n%s", want, compact)
				}
			}
			for _, not := range tt.hasNot {
				if strings.Contains(compact, not) {
					t.Errorf("answer holds %s:\n%s", not, compact)
				}
			}
		})
	}

	// What the ledger was told, in order.
	var got []string
	for _, c := range d.Changes() {
		got = append(got, string(c.Transition)+" "+c.ID.String()+" by "+c.Who)
	}
	want := []string{"approve orders.billing.dlq/0/17 by ops/alice", "approve orders.billing.dlq/0/17 by ops", "terminate orders.dlq/3 by ops/bob"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if logs := logs.String(); !strings.Contains(logs, "approving a dead letter") || !strings.Contains(logs, "broker said no") {
		t.Errorf("the internal failure is not logged:\n%s", logs)
	}
	reqs := d.Requests()
	if len(reqs) != 5 || reqs[1].Who != "ops/carol" || reqs[1].Why != "fixed" || reqs[1].SampleTimeout != 0 ||
		len(reqs[1].IDs) != 1 || reqs[1].IDs[0] != kafkaID || !reqs[2].DryRun || reqs[2].Filter.Source != "billing" {
		t.Errorf("replay requests %+v", reqs)
	}
}

// compactJSON is a JSON answer on one line without its zero values (the
// gateway writes every field), for looking for pieces in it.
func compactJSON(b []byte) string {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return string(b)
	}
	out, _ := json.Marshal(sparse(v))
	return string(out)
}

// sparse drops the zero values of a decoded JSON value.
func sparse(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if e = sparse(e); e == nil {
				delete(x, k)
			} else {
				x[k] = e
			}
		}
		if len(x) == 0 {
			return nil
		}
	case []any:
		if len(x) == 0 {
			return nil
		}
		for i := range x {
			x[i] = sparse(x[i])
		}
	case string:
		if x == "" || x == "0" {
			return nil
		}
	case bool:
		if !x {
			return nil
		}
	case float64:
		if x == 0 {
			return nil
		}
	}
	return v
}

// The same calls over gRPC, and the codes REST turned into statuses.
func TestDeadLettersGRPC(t *testing.T) {
	d := sampleDeadLetters()
	d.FailApply(rabbitB, deadletter.ErrLost)
	addr := serveOptions(t, Options{Token: []byte(dlToken), DeadLetters: d, Now: func() time.Time { return t0.Add(2 * time.Hour) }})
	c := grpcClient(t, addr)
	ctx := authed("Bearer " + dlToken)

	l, err := c.GetDeadLetter(ctx, &adminv1.GetDeadLetterRequest{Id: kafkaStr, BodyLimit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if l.GetId() != kafkaStr || l.GetSource() != "billing" || l.GetState() != "pending" || string(l.GetBody()) != "xxxxxxxxxx" || !l.GetBodyTruncated() ||
		l.GetBodySize() != 100 || l.GetAttempts() != 3 || !l.GetDeadLetteredAt().AsTime().Equal(t0.Add(-time.Minute)) || len(l.GetHandoffs()) != 1 {
		t.Errorf("GetDeadLetter = %v", l)
	}
	l, err = c.ApproveDeadLetter(ctx, &adminv1.ApproveDeadLetterRequest{Id: kafkaStr, Reason: "ok", RepairBody: []byte("new"), RepairContentType: "application/json"})
	if err != nil {
		t.Fatal(err)
	}
	h := l.GetHistory()
	if len(h) != 1 || h[0].GetWho() != DefaultTokenName || h[0].GetTransition() != "approve" || h[0].GetState() != "approved" ||
		string(l.GetRepair().GetBody()) != "new" || l.GetRepair().GetContentType() != "application/json" {
		t.Errorf("ApproveDeadLetter = %v", l)
	}
	list, err := c.ListDeadLetters(ctx, &adminv1.ListDeadLettersRequest{Source: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	counts := list.GetCounts()
	if len(list.GetDeadLetters()) != 1 || len(counts) != 1 || counts[0].GetOpen() != 1 || counts[0].GetByState()["approved"] != 1 ||
		counts[0].GetOldestOpenAge().AsDuration() != 2*time.Hour+time.Minute {
		t.Errorf("ListDeadLetters = %v", list)
	}

	tests := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"a bad id", func() error {
			_, err := c.GetDeadLetter(ctx, &adminv1.GetDeadLetterRequest{Id: "x"})
			return err
		}, codes.InvalidArgument},
		{"no id", func() error {
			_, err := c.GetDeadLetter(ctx, &adminv1.GetDeadLetterRequest{})
			return err
		}, codes.InvalidArgument},
		{"an unknown id", func() error {
			_, err := c.GetDeadLetter(ctx, &adminv1.GetDeadLetterRequest{Id: "orders.dlq/9"})
			return err
		}, codes.NotFound},
		{"a lost race", func() error {
			_, err := c.TerminateDeadLetter(ctx, &adminv1.TerminateDeadLetterRequest{Id: rabbitB.String(), Reason: "r"})
			return err
		}, codes.Aborted},
		{"an illegal change", func() error {
			_, err := c.TerminateDeadLetter(ctx, &adminv1.TerminateDeadLetterRequest{Id: kafkaStr, Reason: "r"})
			if err == nil {
				_, err = c.ApproveDeadLetter(ctx, &adminv1.ApproveDeadLetterRequest{Id: kafkaStr, Reason: "r"})
			}
			return err
		}, codes.FailedPrecondition},
		{"a repair too large", func() error {
			_, err := c.ApproveDeadLetter(ctx, &adminv1.ApproveDeadLetterRequest{Id: rabbitA.String(), Reason: "r", RepairBody: make([]byte, deadletter.MaxRepairBody+1)})
			return err
		}, codes.InvalidArgument},
		{"an operator too long", func() error {
			_, err := c.ApproveDeadLetter(ctx, &adminv1.ApproveDeadLetterRequest{Id: rabbitA.String(), Reason: "r", Operator: strings.Repeat("a", MaxOperatorLen+1)})
			return err
		}, codes.InvalidArgument},
		{"an unknown replay", func() error {
			_, err := c.CancelReplay(ctx, &adminv1.CancelReplayRequest{Id: "r7"})
			return err
		}, codes.NotFound},
		{"a replay of an unknown id", func() error {
			_, err := c.CreateReplay(ctx, &adminv1.CreateReplayRequest{Ids: []string{"orders.dlq/77"}})
			return err
		}, codes.NotFound},
		{"a replay naming an id twice", func() error {
			_, err := c.CreateReplay(ctx, &adminv1.CreateReplayRequest{Ids: []string{"orders.dlq/3", "orders.dlq/3"}})
			return err
		}, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); grpcstatus.Code(err) != tt.code {
				t.Errorf("%v, want %v", err, tt.code)
			}
		})
	}

	// A replay, followed to its end and cancelled before it.
	run, err := c.CreateReplay(ctx, &adminv1.CreateReplayRequest{Source: "orders", States: []string{"pending"}, Force: true, RatePerSecond: 5,
		SampleTimeout: durationpb.New(time.Minute), Operator: "dan"})
	if err != nil {
		t.Fatal(err)
	}
	if run.GetState() != "running" || run.GetCreatedBy() != "admin/dan" || run.GetRatePerSecond() != 5 || !run.GetForce() || len(run.GetIds()) != 1 {
		t.Errorf("CreateReplay = %v", run)
	}
	id := run.GetId()
	run, err = c.PauseReplay(ctx, &adminv1.PauseReplayRequest{Id: id, Reason: "the app is being fixed", Operator: "eve"})
	if err != nil || !run.GetHeld() || !run.GetPaused() || !strings.Contains(run.GetDetail(), "admin/eve") {
		t.Errorf("PauseReplay = %v, %v", run, err)
	}
	if _, err := c.PauseReplay(ctx, &adminv1.PauseReplayRequest{Id: id}); grpcstatus.Code(err) != codes.FailedPrecondition {
		t.Errorf("paused twice: %v", err)
	}
	if run, err = c.ResumeReplay(ctx, &adminv1.ResumeReplayRequest{Id: id, Operator: "eve"}); err != nil || run.GetHeld() || run.GetPaused() {
		t.Errorf("ResumeReplay = %v, %v", run, err)
	}
	if _, err := c.ResumeReplay(ctx, &adminv1.ResumeReplayRequest{Id: id}); grpcstatus.Code(err) != codes.FailedPrecondition {
		t.Errorf("resumed twice: %v", err)
	}
	run, err = c.CancelReplay(ctx, &adminv1.CancelReplayRequest{Id: id, Reason: "wrong one", Operator: "dan"})
	if err != nil || run.GetState() != "cancelled" || run.GetEndedAt() == nil || !strings.Contains(run.GetDetail(), "admin/dan") {
		t.Errorf("CancelReplay = %v, %v", run, err)
	}
	reqs := d.Requests()
	if r := reqs[len(reqs)-1]; r.SampleTimeout != time.Minute || r.Rate != 5 || r.Filter.States[0] != deadletter.Pending || !r.Force {
		t.Errorf("the replay request = %+v", r)
	}
}
