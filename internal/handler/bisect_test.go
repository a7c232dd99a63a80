package handler

import (
	"encoding/json"
	"fmt"
	"io"
	"math/bits"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"handoff.dev/handoff/internal/budget"
)

// poisonApp fails a whole request that holds one of the poison event ids,
// as a handler that crashes on one event does, with the status whole picks
// for the request's ids (0: answer event by event, every event 200). It
// records each request's event ids.
type poisonApp struct {
	mu       sync.Mutex
	requests [][]string
	// redelivered is each event's handoffredelivered, request by request.
	redelivered map[string][]string
}

func newPoisonApp(t *testing.T, whole func(ids []string) int) (*poisonApp, *httptest.Server) {
	t.Helper()
	a := &poisonApp{redelivered: map[string][]string{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var events []map[string]any
		if err := json.NewDecoder(r.Body).Decode(&events); err != nil {
			t.Errorf("batch body: %v", err)
		}
		var ids []string
		a.mu.Lock()
		for _, e := range events {
			id := e["id"].(string)
			ids = append(ids, id)
			flag, _ := e["handoffredelivered"].(string)
			a.redelivered[id] = append(a.redelivered[id], flag)
		}
		a.requests = append(a.requests, ids)
		a.mu.Unlock()
		if code := whole(ids); code != 0 {
			w.WriteHeader(code)
			_, _ = io.WriteString(w, "crashed")
			return
		}
		var results []map[string]any
		for _, id := range ids {
			results = append(results, map[string]any{"id": id, "status": 200})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
	}))
	t.Cleanup(srv.Close)
	return a, srv
}

func (a *poisonApp) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.requests)
}

// holding returns a whole-request status function: code when the request
// holds one of ids, else 0.
func holding(code int, ids ...string) func([]string) int {
	return func(got []string) int {
		for _, g := range got {
			if slices.Contains(ids, g) {
				return code
			}
		}
		return 0
	}
}

// fresh returns n first attempts e-0 … e-(n-1).
func fresh(n int) []*Request {
	reqs := make([]*Request, n)
	for i := range reqs {
		reqs[i] = attempt(fmt.Sprintf("e-%d", i), nil, "")
	}
	return reqs
}

// tokens is a split budget holding a fixed number of tokens. A refund puts
// its token back unless spendOnce is set.
type tokens struct {
	mu                    sync.Mutex
	left, spent, refunded int
	spendOnce             bool
}

func (b *tokens) TrySpend() (func(), bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.left == 0 {
		return nil, false
	}
	b.left--
	b.spent++
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if !b.spendOnce {
			b.left++
		}
		b.refunded++
	}, true
}

// checkPoisoned fails unless exactly the attempts named in poisoned got
// want, and every other one succeeded.
func checkPoisoned(t *testing.T, reqs []*Request, res []Result, want budget.Outcome, poisoned ...string) {
	t.Helper()
	for i, r := range res {
		w := budget.Success
		if slices.Contains(poisoned, reqs[i].EventID) {
			w = want
		}
		if r.Outcome != w {
			t.Errorf("%s: %v (%s), want %v", reqs[i].EventID, r.Outcome, r.Detail, w)
		}
	}
}

// One poison message in a batch of n costs 2·log2(n) extra requests, and
// only it gets the failure.
func TestBatchSplitIsolatesOnePoison(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		status int
		want   budget.Outcome
	}{
		{"500 in 16", 16, http.StatusInternalServerError, budget.Retry},
		{"500 in 8", 8, http.StatusInternalServerError, budget.Retry},
		{"500 in 2", 2, http.StatusInternalServerError, budget.Retry},
		{"422 in 16", 16, http.StatusUnprocessableEntity, budget.Permanent},
		{"400 in 4", 4, http.StatusBadRequest, budget.Permanent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs := fresh(tc.n)
			poison := reqs[tc.n/3].EventID
			app, srv := newPoisonApp(t, holding(tc.status, poison))
			budget := &tokens{left: 100}
			b := NewBatcher(newClient(t, srv.URL, tc.n), BatchOptions{MaxMessages: tc.n, MaxWait: time.Minute, Budget: budget})
			defer b.Close()
			res := deliverAll(b, reqs...)
			checkPoisoned(t, reqs, res, tc.want, poison)
			// Each level of the split: one request for the half holding the
			// poison and one for the other half.
			levels := bits.Len(uint(tc.n - 1))
			if n := app.count(); n != 1+2*levels {
				t.Errorf("%d requests for one poison in %d, want 1 + 2·%d", n, tc.n, levels)
			}
			if budget.spent != app.count()-1 || budget.refunded != levels {
				t.Errorf("budget: %d spent, %d refunded; want one per extra request (%d), refunded for each that succeeded (%d)",
					budget.spent, budget.refunded, app.count()-1, levels)
			}
			if d := res[tc.n/3].Detail; d != "HTTP "+strconv.Itoa(tc.status)+": crashed" {
				t.Errorf("the poison's evidence = %q, want its own answer", d)
			}
		})
	}
}

func TestBatchSplitIsolatesTwoPoisons(t *testing.T) {
	reqs := fresh(16)
	app, srv := newPoisonApp(t, holding(http.StatusInternalServerError, "e-3", "e-11"))
	b := NewBatcher(newClient(t, srv.URL, 16), BatchOptions{MaxMessages: 16, MaxWait: time.Minute, Budget: &tokens{left: 100}})
	defer b.Close()
	res := deliverAll(b, reqs...)
	checkPoisoned(t, reqs, res, budget.Retry, "e-3", "e-11")
	// Their positions in the batch depend on arrival: in one half they cost
	// 2·4 extra requests, in two halves 2 + 3·4.
	n := app.count()
	t.Logf("%d requests for two poisons in 16", n)
	if n < 9 || n > 15 {
		t.Errorf("%d requests, want 9 to 15", n)
	}
}

// Whole-batch answers about the app, not a message, are not split.
func TestBatchSplitNotForTheApp(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		want   budget.Outcome
	}{
		{"503", http.StatusServiceUnavailable, budget.Overload},
		{"429", http.StatusTooManyRequests, budget.Overload},
		{"409", http.StatusConflict, budget.Defer},
		{"410", http.StatusGone, budget.Drop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs := fresh(16)
			app, srv := newPoisonApp(t, func([]string) int { return tc.status })
			b := NewBatcher(newClient(t, srv.URL, 16), BatchOptions{MaxMessages: 16, MaxWait: time.Minute, Budget: &tokens{left: 100}})
			defer b.Close()
			for i, r := range deliverAll(b, reqs...) {
				if r.Outcome != tc.want {
					t.Errorf("message %d: %v, want %v", i, r.Outcome, tc.want)
				}
			}
			if n := app.count(); n != 1 {
				t.Errorf("%d requests, want 1: not split", n)
			}
		})
	}
}

// A part that answers overload stops the split there: that part gets the
// overload, the other half its own answers.
func TestBatchSplitStopsAtOverload(t *testing.T) {
	reqs := fresh(16)
	poison := reqs[2].EventID
	app, srv := newPoisonApp(t, func(ids []string) int {
		if !slices.Contains(ids, poison) {
			return 0
		}
		if len(ids) == 16 {
			return http.StatusInternalServerError
		}
		return http.StatusServiceUnavailable
	})
	b := NewBatcher(newClient(t, srv.URL, 16), BatchOptions{MaxMessages: 16, MaxWait: time.Minute, Budget: &tokens{left: 100}})
	defer b.Close()
	res := deliverAll(b, reqs...)
	var overloaded []string
	for i, r := range res {
		switch r.Outcome {
		case budget.Overload:
			overloaded = append(overloaded, reqs[i].EventID)
		case budget.Success:
		default:
			t.Errorf("%s: %v", reqs[i].EventID, r.Outcome)
		}
	}
	if len(overloaded) != 8 || !slices.Contains(overloaded, poison) {
		t.Errorf("overloaded %v, want the 8 of the poison's half", overloaded)
	}
	if n := app.count(); n != 3 {
		t.Errorf("%d requests, want 3", n)
	}
}

// With no token, the split stops: the part left unsent keeps the batch's
// failure, with the reason in its evidence.
func TestBatchSplitNeedsBudget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		tokens   int
		requests int
		failed   int // messages given the failure, the poison included
		limit    string
	}{
		{name: "no token", tokens: 0, requests: 1, failed: 16, limit: "retry budget empty"},
		{name: "two tokens", tokens: 2, requests: 3, failed: 8, limit: "retry budget empty"},
		{name: "plenty", tokens: 1000, requests: 9, failed: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reqs := fresh(16)
			poison := reqs[5].EventID
			app, srv := newPoisonApp(t, holding(http.StatusInternalServerError, poison))
			// Refunds do not count here: which half is called first, and so
			// may see a refunded token, depends on arrival order.
			tk := &tokens{left: tc.tokens, spendOnce: true}
			b := NewBatcher(newClient(t, srv.URL, 16), BatchOptions{MaxMessages: 16, MaxWait: time.Minute, Budget: tk})
			defer b.Close()
			failed := 0
			for i, r := range deliverAll(b, reqs...) {
				if r.Outcome == budget.Success {
					continue
				}
				failed++
				if r.Outcome != budget.Retry {
					t.Errorf("%s: %v", reqs[i].EventID, r.Outcome)
				}
				if reqs[i].EventID != poison && !strings.Contains(r.Detail, tc.limit) {
					t.Errorf("%s: evidence %q does not say why it was not split", reqs[i].EventID, r.Detail)
				}
			}
			if n := app.count(); n != tc.requests || failed != tc.failed {
				t.Errorf("%d requests, %d failed; want %d and %d", n, failed, tc.requests, tc.failed)
			}
			if tk.spent > tc.tokens {
				t.Errorf("spent %d tokens of %d", tk.spent, tc.tokens)
			}
		})
	}
}

// A batch in which every message fails stops splitting at its bound rather
// than sending each message alone.
func TestBatchSplitBounded(t *testing.T) {
	reqs := fresh(16)
	app, srv := newPoisonApp(t, func([]string) int { return http.StatusInternalServerError })
	b := NewBatcher(newClient(t, srv.URL, 16), BatchOptions{MaxMessages: 16, MaxWait: time.Minute})
	defer b.Close()
	for i, r := range deliverAll(b, reqs...) {
		if r.Outcome != budget.Retry {
			t.Errorf("message %d: %v", i, r.Outcome)
		}
	}
	if n := app.count(); n != 1+splitLimit(16) {
		t.Errorf("%d requests, want 1 + %d", n, splitLimit(16))
	}
}

// A request that times out is split too, and each part gets its own timeout.
func TestBatchSplitOnTimeout(t *testing.T) {
	reqs := fresh(4)
	for _, r := range reqs {
		r.Timeout = 300 * time.Millisecond
	}
	poison := reqs[1].EventID
	hang := make(chan struct{})
	defer close(hang)
	app, srv := newPoisonApp(t, func(ids []string) int {
		if slices.Contains(ids, poison) {
			<-hang // until the test ends: the sidecar gives up first
		}
		return 0
	})
	b := NewBatcher(newClient(t, srv.URL, 4), BatchOptions{MaxMessages: 4, MaxWait: time.Minute})
	defer b.Close()
	res := deliverAll(b, reqs...)
	checkPoisoned(t, reqs, res, budget.Unknown, poison)
	if n := app.count(); n != 5 {
		t.Errorf("%d requests, want 5", n)
	}
	// The app may have taken the request that timed out: every event sent
	// again after it says so, as any attempt after an unknown answer does.
	app.mu.Lock()
	defer app.mu.Unlock()
	for _, r := range reqs {
		flags := app.redelivered[r.EventID]
		if len(flags) < 2 || flags[0] != "false" || slices.ContainsFunc(flags[1:], func(f string) bool { return f != "true" }) {
			t.Errorf("%s: handoffredelivered %v request by request, want false, then true each time it went again", r.EventID, flags)
		}
		if r.Redelivered {
			t.Errorf("%s: the caller's request was changed; the split must send a copy", r.EventID)
		}
	}
}

// A message whose deadline is too close for another request is not sent
// again when its batch splits: it keeps the batch's failure.
func TestBatchSplitRespectsDeadline(t *testing.T) {
	reqs := fresh(4)
	reqs[3].Deadline = time.Now().Add(500 * time.Millisecond)
	poison := reqs[0].EventID
	app, srv := newPoisonApp(t, holding(http.StatusInternalServerError, poison))
	b := NewBatcher(newClient(t, srv.URL, 4), BatchOptions{MaxMessages: 4, MaxWait: time.Minute, MinCall: time.Second})
	defer b.Close()
	res := deliverAll(b, reqs...)
	checkPoisoned(t, reqs, res, budget.Retry, poison, reqs[3].EventID)
	for _, ids := range app.requests[1:] {
		if slices.Contains(ids, reqs[3].EventID) {
			t.Errorf("a message too close to its deadline was sent again: %v", ids)
		}
	}
}
