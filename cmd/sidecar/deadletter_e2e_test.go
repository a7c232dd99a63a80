package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/testkit"
)

// The dead-letter lifecycle of DESIGN §7 through running sidecars: dead
// letters listed with their evidence, approved, repaired, terminated,
// replayed at a rate with a sample, the same on every replica.

// dlqTarget is one source on a real broker that several replicas consume.
type dlqTarget struct {
	// cfg is a replica's config: the source (named "test"), an admin API
	// with the test token, and short dead-letter timings.
	cfg func(appURL string) config.Config
	// publish publishes one message per id, with body(id) as its body.
	publish func(ids []string, body func(id string) string)
}

func dlqConfig(cfg config.Config, t *testing.T) config.Config {
	cfg.Retry.MaxAttempts = 2
	cfg.Admin.Listen, cfg.Admin.TokenFile = "127.0.0.1:0", tokenFile(t, adminTestToken, 0o600)
	cfg.DeadLetter.Poll = config.Duration(100 * time.Millisecond)
	cfg.DeadLetter.ReplayTakeover = config.Duration(2 * time.Second)
	return cfg
}

func rabbitDLQTarget(t *testing.T) dlqTarget {
	conn := dialRabbit(t)
	t.Cleanup(func() { _ = conn.Close() })
	tiers := []time.Duration{200 * time.Millisecond}
	q := testQueue(t, conn, tiers)
	return dlqTarget{
		cfg: func(appURL string) config.Config { return dlqConfig(testConfig(appURL, q, tiers...), t) },
		publish: func(ids []string, body func(string) string) {
			var ms []publishing
			for _, id := range ids {
				ms = append(ms, publishing{MessageId: id, ContentType: "application/json", Body: []byte(body(id))})
			}
			publish(t, conn, q, ms...)
		},
	}
}

func kafkaDLQTarget(t *testing.T) dlqTarget {
	brokers, topic := realKafkaTopic(t, "dlq", 2)
	return dlqTarget{
		cfg: func(appURL string) config.Config {
			return dlqConfig(kafkaConfig(appURL, brokers, topic, 200*time.Millisecond), t)
		},
		publish: func(ids []string, body func(string) string) {
			var recs []*kgo.Record
			for _, id := range ids {
				recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("key-" + id), Value: []byte(body(id)),
					Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}, {Key: "content-type", Value: []byte("application/json")}}})
			}
			produceKafka(t, brokers, recs...)
		},
	}
}

// brokenApp fails every message while broken is set: ids starting "perm"
// with 422 (dead-lettered at once, reason permanent), the others with 503
// (retried, then dead-lettered: max-attempts). Once fixed it handles all.
func brokenApp(t *testing.T, broken *atomic.Bool) *app {
	return newApp(t, func(w http.ResponseWriter, c call, _ []call) {
		switch {
		case !broken.Load():
			w.WriteHeader(http.StatusOK)
		case strings.HasPrefix(c.Header.Get("Ce-Id"), "perm"):
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = w.Write([]byte("amount invalid"))
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
}

var authed = withAuth("Bearer " + adminTestToken)

// counts is a source's counts as a replica's admin API gives them.
func counts(t *testing.T, c adminv1.AdminClient) *adminv1.DeadLetterCounts {
	t.Helper()
	resp, err := c.ListDeadLetters(authed, &adminv1.ListDeadLettersRequest{Source: "test", PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range resp.GetCounts() {
		if cs.GetSource() == "test" {
			return cs
		}
	}
	t.Fatalf("no counts for source test: %v", resp.GetCounts())
	return nil
}

// allLetters lists every dead letter of the source, page by page.
func allLetters(t *testing.T, c adminv1.AdminClient, states ...string) []*adminv1.DeadLetter {
	t.Helper()
	var out []*adminv1.DeadLetter
	req := &adminv1.ListDeadLettersRequest{Source: "test", States: states, PageSize: 7}
	for {
		resp, err := c.ListDeadLetters(authed, req)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, resp.GetDeadLetters()...)
		if resp.GetNextPageToken() == "" {
			return out
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// waitCounts waits until a replica shows want by state.
func waitCounts(t *testing.T, c adminv1.AdminClient, want map[string]int64) {
	t.Helper()
	var got map[string]int64
	testkit.Eventually(t, 60*time.Second, fmt.Sprintf("dead letters by state %v (last %v)", want, &got), func() bool {
		got = counts(t, c).GetByState()
		if len(got) != len(want) {
			return false
		}
		for s, n := range want {
			if got[s] != n {
				return false
			}
		}
		return true
	})
}

// waitReplay waits until a replay ended and every copy it published has
// its outcome, and returns it.
func waitReplay(t *testing.T, c adminv1.AdminClient, id string, timeout time.Duration) *adminv1.Replay {
	t.Helper()
	var r *adminv1.Replay
	testkit.Eventually(t, timeout, "replay "+id+" to end", func() bool {
		var err error
		r, err = c.GetReplay(authed, &adminv1.GetReplayRequest{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		p := r.GetProgress()
		return r.GetState() != "running" && p.GetPublished() == p.GetHandled()+p.GetFailed()
	})
	return r
}

// replayCalls are the app's calls that carried replay id, by event id.
func replayCalls(a *app, replay string) map[string][]call {
	out := map[string][]call{}
	for _, c := range a.allCalls() {
		if c.Header.Get("Handoff-Replay-Id") == replay {
			out[c.Header.Get("Ce-Id")] = append(out[c.Header.Get("Ce-Id")], c)
		}
	}
	return out
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	return out
}

func TestDeadLetterLifecycleRabbitMQ(t *testing.T) {
	t.Parallel()
	testDeadLetterLifecycle(t, rabbitDLQTarget(t))
}

func TestDeadLetterLifecycleKafka(t *testing.T) {
	t.Parallel()
	testDeadLetterLifecycle(t, kafkaDLQTarget(t))
}

// testDeadLetterLifecycle is the scenario: 50 dead letters of two
// reasons, 40 approved and 5 terminated once the app is fixed, the approved
// replayed at 20/s with a sample of 5; two replicas agree throughout.
func testDeadLetterLifecycle(t *testing.T, target dlqTarget) {
	var broken atomic.Bool
	broken.Store(true)
	a := brokenApp(t, &broken)
	// No runner dies here: the takeover's default bound, not the 2 s the
	// takeover test needs, which a runner on a loaded machine once missed —
	// the replay was taken over from a live runner and copies published
	// twice.
	cfg := func() config.Config {
		cfg := target.cfg(a.url())
		cfg.DeadLetter.ReplayTakeover = config.Default().DeadLetter.ReplayTakeover
		return cfg
	}
	sa := startSidecar(t, cfg())
	sb := startSidecar(t, cfg())
	ca, cb := grpcAdmin(t, sa.admin), grpcAdmin(t, sb.admin)

	perm, busy := ids("perm", 25), ids("busy", 25)
	target.publish(append(slices.Clone(perm), busy...), func(id string) string { return `{"order":"` + id + `"}` })
	waitCounts(t, ca, map[string]int64{"pending": 50})
	waitCounts(t, cb, map[string]int64{"pending": 50})

	letters := allLetters(t, ca, "pending")
	if len(letters) != 50 {
		t.Fatalf("listed %d pending, want 50", len(letters))
	}
	byEvent := map[string]*adminv1.DeadLetter{}
	for _, l := range letters {
		byEvent[l.GetEventId()] = l
		want := "max-attempts"
		if strings.HasPrefix(l.GetEventId(), "perm") {
			want = "permanent"
		}
		if l.GetReason() != want || l.GetError() == "" || l.GetAttempts() < 1 || l.GetDeadLetteredAt() == nil || l.GetBody() != nil {
			t.Fatalf("dead letter %s: reason %q (want %q), error %q, attempts %d, at %v, body in a list %q",
				l.GetId(), l.GetReason(), want, l.GetError(), l.GetAttempts(), l.GetDeadLetteredAt(), l.GetBody())
		}
	}
	if len(byEvent) != 50 {
		t.Fatalf("%d distinct events among 50 dead letters", len(byEvent))
	}

	broken.Store(false)
	approve := append(slices.Clone(perm), busy[:15]...)
	terminate, keep := busy[15:20], busy[20:]
	// One approval over REST, the id's slashes and all; the rest over gRPC.
	first := byEvent[approve[0]].GetId()
	code, body := restPost(t, sa.admin, "/v1/deadletters/"+first+":approve", "Bearer "+adminTestToken,
		`{"reason":"the app is fixed","operator":"alice"}`)
	if code != http.StatusOK || !strings.Contains(body, `"state":"approved"`) {
		t.Fatalf("REST approve: %d %s", code, body)
	}
	for _, ev := range approve[1:] {
		if _, err := ca.ApproveDeadLetter(authed, &adminv1.ApproveDeadLetterRequest{Id: byEvent[ev].GetId(), Reason: "the app is fixed", Operator: "alice"}); err != nil {
			t.Fatalf("approve %s: %v", ev, err)
		}
	}
	for _, ev := range terminate {
		if _, err := cb.TerminateDeadLetter(authed, &adminv1.TerminateDeadLetterRequest{Id: byEvent[ev].GetId(), Reason: "duplicate order, refunded by hand", Operator: "bob"}); err != nil {
			t.Fatalf("terminate %s: %v", ev, err)
		}
	}
	waitCounts(t, cb, map[string]int64{"approved": 40, "terminated": 5, "pending": 5})

	start := time.Now()
	run, err := ca.CreateReplay(authed, &adminv1.CreateReplayRequest{Source: "test", RatePerSecond: 20, Sample: 5, Why: "orders app fixed", Operator: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if run.GetProgress().GetSelected() != 40 {
		t.Fatalf("replay selected %d, want the 40 approved", run.GetProgress().GetSelected())
	}
	run = waitReplay(t, ca, run.GetId(), 60*time.Second)
	p := run.GetProgress()
	if run.GetState() != "completed" || p.GetHandled() != 40 || p.GetFailed() != 0 || p.GetRemaining() != 0 {
		t.Fatalf("replay %v", run)
	}
	t.Logf("replay of 40 took %v: %v", time.Since(start).Round(time.Millisecond), run.GetDetail())
	waitCounts(t, ca, map[string]int64{"done": 40, "terminated": 5, "pending": 5})
	waitCounts(t, cb, map[string]int64{"done": 40, "terminated": 5, "pending": 5})

	// Each approved event reached the app once more, under its own event id
	// with the replay's id; nothing else was replayed.
	calls := replayCalls(a, run.GetId())
	var times []time.Time
	for _, ev := range approve {
		cs := calls[ev]
		if len(cs) != 1 {
			t.Fatalf("event %s reached the app %d times with the replay id", ev, len(cs))
		}
		if got := string(cs[0].Body); got != `{"order":"`+ev+`"}` {
			t.Fatalf("event %s replayed with body %s", ev, got)
		}
		times = append(times, cs[0].At)
	}
	if len(calls) != 40 {
		t.Fatalf("%d events replayed, want 40", len(calls))
	}
	// The rate: the 35 after the sample were published at 20/s. The
	// publish times are the Replay records' (each dated when its publish
	// started, and written once the copy was confirmed); a Replay record
	// refused because the copy's outcome came first leaves a letter out.
	// The rate is the slope of a least-squares line through (time, rank).
	var published []time.Time
	if len(run.GetIds()) != 40 {
		t.Fatalf("the replay names %d dead letters", len(run.GetIds()))
	}
	for _, id := range run.GetIds()[5:] { // the sample is the first 5
		l, err := ca.GetDeadLetter(authed, &adminv1.GetDeadLetterRequest{Id: id, BodyLimit: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range l.GetHistory() {
			if h.GetTransition() == "replay" && h.GetReplayId() == run.GetId() {
				published = append(published, h.GetAt().AsTime())
			}
		}
	}
	sort.Slice(published, func(i, j int) bool { return published[i].Before(published[j]) })
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	if len(published) < 30 {
		t.Fatalf("%d of 35 Replay records in the ledger", len(published))
	}
	rate := arrivalRate(published)
	t.Logf("measured publish rate after the sample: %.2f/s (asked 20/s); the app received them at %.2f/s",
		rate, arrivalRate(times[5:]))
	// Paced at the asked rate: never above it, which is what protects the
	// app. The times are the confirms', which a loaded broker can hold back
	// at the start and then answer together: their slope has read up to 12%
	// above the publishes' pace. An unpaced runner would be many times it.
	if rate > 25 {
		t.Fatalf("replay rate %.2f/s, want 20/s: +25%% at most (the confirms' jitter)", rate)
	}
	// On an idle machine the rate holds 20/s within 1%. On a loaded one
	// each publish waits its confirm's round trip, and the rate has read
	// 4.5/s with a core taken and the suite beside it: the average says
	// how busy the machine is. A runner that stalls shows as a gap.
	var gap time.Duration
	for i := 1; i < len(published); i++ {
		gap = max(gap, published[i].Sub(published[i-1]))
	}
	if gap > 10*time.Second {
		t.Fatalf("the replay stalled: %v between two publishes (asked 20/s)", gap)
	}
	for _, ev := range keep {
		l, err := cb.GetDeadLetter(authed, &adminv1.GetDeadLetterRequest{Id: byEvent[ev].GetId()})
		if err != nil || l.GetState() != "pending" {
			t.Fatalf("kept %s: %v, %v", ev, l.GetState(), err)
		}
	}
	l, err := cb.GetDeadLetter(authed, &adminv1.GetDeadLetterRequest{Id: byEvent[terminate[0]].GetId()})
	if err != nil || l.GetState() != "terminated" || len(l.GetHistory()) != 1 ||
		l.GetHistory()[0].GetWhy() != "duplicate order, refunded by hand" || !strings.Contains(l.GetHistory()[0].GetWho(), "bob") {
		t.Fatalf("terminated letter: %v, %v", l, err)
	}
}

// restPost posts a JSON body to the REST side.
func restPost(t *testing.T, addr, path, auth, body string) (int, string) {
	t.Helper()
	u := url.URL{Scheme: "http", Host: addr, Opaque: "//" + addr + path}
	req, err := http.NewRequest(http.MethodPost, u.String(), bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// A replay into a still-broken app stops after its sample; a repaired body
// reaches the app under the original event id; mutations without the token
// change nothing.
func TestDeadLetterThresholdRepairAndTokenRabbitMQ(t *testing.T) {
	t.Parallel()
	target := rabbitDLQTarget(t)
	var broken atomic.Bool
	broken.Store(true)
	a := brokenApp(t, &broken)
	s := startSidecar(t, target.cfg(a.url()))
	c := grpcAdmin(t, s.admin)
	perm := ids("perm", 10)
	target.publish(append(slices.Clone(perm), "perm-repair"), func(id string) string {
		if id == "perm-repair" {
			return `{"amount":"invalid"}`
		}
		return `{"order":"` + id + `"}`
	})
	waitCounts(t, c, map[string]int64{"pending": 11})
	st, err := c.GetStatus(authed, &adminv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if dl := st.GetSources()[0].GetDeadLetters(); dl.GetOpen() != 11 || dl.GetOldestOpenAge() == nil {
		t.Fatalf("status's dead letters: %v", dl)
	}
	byEvent := map[string]string{}
	for _, l := range allLetters(t, c) {
		byEvent[l.GetEventId()] = l.GetId()
	}

	// Without the token, or with a wrong one: refused, nothing recorded.
	repairID := byEvent["perm-repair"]
	for _, auth := range []string{"", "Bearer wrong-token"} {
		_, err := c.ApproveDeadLetter(withAuth(auth), &adminv1.ApproveDeadLetterRequest{Id: repairID, Reason: "sneaky"})
		if grpcstatus.Code(err) != codes.Unauthenticated {
			t.Fatalf("approve with %q: %v", auth, err)
		}
		if code, _ := restPost(t, s.admin, "/v1/deadletters/"+repairID+":terminate", auth, `{"reason":"sneaky"}`); code != http.StatusUnauthorized {
			t.Fatalf("REST terminate with %q: %d", auth, code)
		}
		if code, _ := restPost(t, s.admin, "/v1/replays", auth, `{"source":"test","force":true}`); code != http.StatusUnauthorized {
			t.Fatalf("REST replay with %q: %d", auth, code)
		}
	}
	if l, err := c.GetDeadLetter(authed, &adminv1.GetDeadLetterRequest{Id: repairID}); err != nil || l.GetState() != "pending" || len(l.GetHistory()) != 0 {
		t.Fatalf("after refused calls: %v, %v", l, err)
	}
	if rs, err := c.ListReplays(authed, &adminv1.ListReplaysRequest{}); err != nil || len(rs.GetReplays()) != 0 {
		t.Fatalf("replays after refused calls: %v, %v", rs, err)
	}

	// Still broken: the sample of 3 fails again and the run stops there.
	for _, ev := range perm {
		if _, err := c.ApproveDeadLetter(authed, &adminv1.ApproveDeadLetterRequest{Id: byEvent[ev], Reason: "try again"}); err != nil {
			t.Fatal(err)
		}
	}
	run, err := c.CreateReplay(authed, &adminv1.CreateReplayRequest{Source: "test", RatePerSecond: 50, Sample: 3, StopFailureRatio: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	run = waitReplay(t, c, run.GetId(), 30*time.Second)
	if run.GetState() != "stopped" || run.GetProgress().GetPublished() != 3 || run.GetProgress().GetFailed() != 3 ||
		!strings.Contains(run.GetDetail(), "sample") {
		t.Fatalf("replay into a broken app: %v", run)
	}
	t.Logf("stopped: %s", run.GetDetail())
	if n := len(replayCalls(a, run.GetId())); n != 3 {
		t.Fatalf("%d events replayed into the broken app, want the sample of 3", n)
	}
	// The 3 failed again: 3 failed-replay, each with a new pending dead
	// letter; 7 still approved; the repair candidate still pending.
	waitCounts(t, c, map[string]int64{"failed-replay": 3, "approved": 7, "pending": 4})

	// Repair: approved with a fixed body, replayed, handled with it.
	broken.Store(false)
	if _, err := c.ApproveDeadLetter(authed, &adminv1.ApproveDeadLetterRequest{Id: repairID, Reason: "amount fixed by hand",
		RepairBody: []byte(`{"amount":10}`), RepairNote: "amount=invalid → amount=10"}); err != nil {
		t.Fatal(err)
	}
	run, err = c.CreateReplay(authed, &adminv1.CreateReplayRequest{Ids: []string{repairID}})
	if err != nil {
		t.Fatal(err)
	}
	run = waitReplay(t, c, run.GetId(), 30*time.Second)
	got := replayCalls(a, run.GetId())["perm-repair"]
	if run.GetState() != "completed" || len(got) != 1 || string(got[0].Body) != `{"amount":10}` {
		t.Fatalf("repaired replay %v: calls %v", run, got)
	}
	l, err := c.GetDeadLetter(authed, &adminv1.GetDeadLetterRequest{Id: repairID})
	if err != nil || l.GetState() != "done" || string(l.GetBody()) != `{"amount":"invalid"}` || string(l.GetRepair().GetBody()) != `{"amount":10}` {
		t.Fatalf("repaired letter: %v, %v", l, err)
	}
}

// arrivalRate is the slope, in arrivals per second, of the least-squares
// line through the points (time of the i-th arrival, i).
func arrivalRate(times []time.Time) float64 {
	n := float64(len(times))
	var sx, sy, sxx, sxy float64
	for i, at := range times {
		x, y := at.Sub(times[0]).Seconds(), float64(i)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}
