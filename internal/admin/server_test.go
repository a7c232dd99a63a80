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
