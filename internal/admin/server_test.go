package admin

import (
	"net/http"
	"sync"
	"testing"

	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/testkit"
)

// askedJournal records the event ids it is asked for.
type askedJournal struct {
	mu  sync.Mutex
	ids []string
}

func (*askedJournal) Stats() (journal.Stats, error) { return journal.Stats{}, nil }

func (j *askedJournal) Event(_, id string) ([][]journal.Step, error) {
	j.mu.Lock()
	j.ids = append(j.ids, id)
	j.mu.Unlock()
	return [][]journal.Step{{{Key: journal.Key{EventID: id}, Record: journal.Record{Kind: journal.Received}}}}, nil
}

// An event id may hold slashes (a Kafka position is kafka:topic/0/42) and
// any other character, as it is or percent-encoded.
func TestEventIDsInTheRESTPath(t *testing.T) {
	j := &askedJournal{}
	s, err := Listen(Options{Listen: "127.0.0.1:0", Token: []byte("tok"), Engine: fakeEngine{}, Journal: j,
		Sources: []Source{{Name: "orders"}}})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, s.Run)
	tests := []struct{ path, id string }{
		{"kafka:orders/0/42", "kafka:orders/0/42"},
		{"kafka:orders%2F0%2F42", "kafka:orders/0/42"},
		{"a%20b", "a b"},
		{"a%3Fb", "a?b"},
		{"a%25b", "a%b"},
		{"a%252Fb", "a%2Fb"},
		{"x.y", "x.y"},
	}
	for _, tt := range tests {
		j.mu.Lock()
		j.ids = nil
		j.mu.Unlock()
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.Addr()+"/v1/events/orders/"+tt.path, nil)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		j.mu.Lock()
		ids := j.ids
		j.mu.Unlock()
		if resp.StatusCode != http.StatusOK || len(ids) != 1 || ids[0] != tt.id {
			t.Errorf("GET …/%s: %d, asked for %q; want 200 and %q", tt.path, resp.StatusCode, ids, tt.id)
		}
	}
}

// The console's files are open (they hold nothing of the sidecar), "/"
// leads to them, and what they show stays behind the token: a call from the
// page without it, or with a wrong one, is refused.
func TestConsoleServedBesideTheAPI(t *testing.T) {
	s, err := Listen(Options{Listen: "127.0.0.1:0", Token: []byte("tok"), Engine: fakeEngine{}, Journal: &askedJournal{}})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, s.Run)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path, auth string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.Addr()+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if r := get("/ui/", ""); r.StatusCode != 200 || r.Header.Get("Content-Security-Policy") == "" {
		t.Errorf("GET /ui/: %d, policy %q", r.StatusCode, r.Header.Get("Content-Security-Policy"))
	}
	if r := get("/", ""); r.StatusCode != http.StatusFound || r.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /: %d to %q", r.StatusCode, r.Header.Get("Location"))
	}
	for _, auth := range []string{"", "Bearer wrong"} {
		if r := get("/v1/activity", auth); r.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET /v1/activity with %q: %d", auth, r.StatusCode)
		}
	}
	if r := get("/v1/activity", "Bearer tok"); r.StatusCode != 200 {
		t.Errorf("GET /v1/activity with the token: %d", r.StatusCode)
	}
	if r := get("/ui2", ""); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /ui2 (not the console): %d, want the guard's 401", r.StatusCode)
	}
}
