package journal

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// queryFixture writes hand-offs with known keys, phases and times:
//
//	key               story             last record at
//	a/e1              settled success   t0+3ms
//	b/e1              in a call         t0+1h+1ms
//	b/e1@r1           received          t0+2h
//	a/e10             settled copy      t0+2h+5ms
//	a/e               transferring      t0+3ms
//	c/e1              received          t0-1h
func queryFixture(t *testing.T) *Journal {
	t.Helper()
	j, _ := openJournal(t, newPath(t), Options{})
	appendOK(t, j, Key{Source: "a", EventID: "e1"}, storySettledSuccess(at(0))...)
	appendOK(t, j, Key{Source: "b", EventID: "e1"}, storyInCall(at(time.Hour))...)
	appendOK(t, j, Key{Source: "b", EventID: "e1", ReplayID: "r1"}, storyReceived(at(2*time.Hour))...)
	appendOK(t, j, Key{Source: "a", EventID: "e10"}, storySettledCopy(at(2*time.Hour))...)
	appendOK(t, j, Key{Source: "a", EventID: "e"}, storyTransferring(at(0))...)
	appendOK(t, j, Key{Source: "c", EventID: "e1"}, storyReceived(at(-time.Hour))...)
	return j
}

func TestScan(t *testing.T) {
	j := queryFixture(t)
	tests := []struct {
		name   string
		filter Filter
		want   []string // Key.String of each hand-off, in any order
	}{
		{name: "everything", filter: Filter{}, want: []string{"a/e1", "b/e1", "b/e1@r1", "a/e10", "a/e", "c/e1"}},
		{name: "event across sources and replays", filter: Filter{EventID: "e1"}, want: []string{"a/e1", "b/e1", "b/e1@r1", "c/e1"}},
		{name: "event is matched exactly, not by prefix", filter: Filter{EventID: "e"}, want: []string{"a/e"}},
		{name: "unknown event", filter: Filter{EventID: "e2"}},
		{name: "open only", filter: Filter{Open: true}, want: []string{"b/e1", "b/e1@r1", "a/e", "c/e1"}},
		{name: "since", filter: Filter{Since: at(time.Hour)}, want: []string{"b/e1", "b/e1@r1", "a/e10"}},
		{name: "since is inclusive", filter: Filter{Since: at(2*time.Hour + 5*time.Millisecond)}, want: []string{"a/e10"}},
		{name: "since after everything", filter: Filter{Since: at(3 * time.Hour)}},
		{name: "event, open, since", filter: Filter{EventID: "e1", Open: true, Since: at(0)}, want: []string{"b/e1", "b/e1@r1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			err := j.Scan(tt.filter, func(k Key, steps []Step) error {
				got = append(got, k.String())
				if len(steps) == 0 {
					t.Errorf("%s: no steps", k)
				}
				// Every step belongs to k, oldest first, and is the
				// whole timeline.
				want := timeline(t, j, k)
				if len(steps) != len(want) {
					t.Errorf("%s: Scan gave %d steps, Timeline %d", k, len(steps), len(want))
				}
				for i, s := range steps {
					if s.Key != k || (i > 0 && s.Seq <= steps[i-1].Seq) {
						t.Errorf("%s: step %d has key %s seq %d", k, i, s.Key, s.Seq)
					}
					if i < len(want) && (s.Seq != want[i].Seq || !equalRecord(s.Record, want[i].Record)) {
						t.Errorf("%s: step %d = %+v, Timeline has %+v", k, i, s, want[i])
					}
				}
				return nil
			})
			if err != nil {
				t.Fatalf("Scan: %v", err)
			}
			slices.Sort(got)
			want := slices.Clone(tt.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("Scan(%+v) = %q, want %q", tt.filter, got, want)
			}
		})
	}
}

func TestScanStopsOnError(t *testing.T) {
	j := queryFixture(t)
	stop := errors.New("enough")
	calls := 0
	err := j.Scan(Filter{}, func(Key, []Step) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) {
		t.Errorf("Scan = %v, want the callback's error", err)
	}
	if calls != 1 {
		t.Errorf("callback called %d times after returning an error, want 1", calls)
	}
}

func TestTimeline(t *testing.T) {
	j := queryFixture(t)
	tests := []struct {
		name  string
		key   Key
		kinds []Kind
	}{
		{name: "settled copy", key: Key{Source: "a", EventID: "e10"}, kinds: []Kind{Received, Attempt, Outcome, Transferring, Transferred, Settled}},
		{name: "in a call", key: Key{Source: "b", EventID: "e1"}, kinds: []Kind{Received, Attempt}},
		{name: "replay is its own hand-off", key: Key{Source: "b", EventID: "e1", ReplayID: "r1"}, kinds: []Kind{Received}},
		{name: "unknown", key: Key{Source: "a", EventID: "e100"}},
		{name: "prefix of a known event", key: Key{Source: "a", EventID: "e1\x00"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			steps := timeline(t, j, tt.key)
			var kinds []Kind
			for i, s := range steps {
				kinds = append(kinds, s.Kind)
				if s.Key != tt.key {
					t.Errorf("step %d has key %s", i, s.Key)
				}
				if i > 0 && (s.Seq <= steps[i-1].Seq || s.At.Before(steps[i-1].At)) {
					t.Errorf("step %d (seq %d at %v) is not after step %d (seq %d at %v)", i, s.Seq, s.At, i-1, steps[i-1].Seq, steps[i-1].At)
				}
			}
			if !slices.Equal(kinds, tt.kinds) {
				t.Errorf("Timeline kinds = %v, want %v", kinds, tt.kinds)
			}
		})
	}
}

// TestTimelineShowsDamagedRecord: an operator's view shows a part it
// cannot read as a step of Kind 0 with the reason, instead of hiding it or
// failing, and goes on to the parts around it.
func TestTimelineShowsDamagedRecord(t *testing.T) {
	path := newPath(t)
	j, _ := openJournal(t, path, Options{})
	k := Key{Source: "s", EventID: "e"}
	story := storySettledSuccess(at(0))
	appendOK(t, j, k, story[:2]...) // received and attempt: one part
	appendOK(t, j, k, story[2:]...) // outcome and settle: another
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	// Damage the first part's checksum in place.
	updateFile(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLog)
		sk, v := b.Cursor().First()
		return damage(b, sk, v)
	})
	// The hand-off is settled, so Open (which reads open hand-offs) accepts it.
	j, _ = openJournal(t, path, Options{})
	check := func(what string, steps []Step) {
		if len(steps) != 3 {
			t.Fatalf("%s: %d steps, want 3 (one for the damaged part, two readable)", what, len(steps))
		}
		if s := steps[0]; s.Kind != 0 || !strings.Contains(s.Detail, ErrCorrupt.Error()) {
			t.Errorf("%s: damaged step = kind %v detail %q, want kind 0 and the reason", what, s.Kind, s.Detail)
		}
		for i, want := range []Kind{Outcome, Settled} {
			if steps[i+1].Kind != want {
				t.Errorf("%s: step %d is %v, want %v", what, i+1, steps[i+1].Kind, want)
			}
		}
	}
	check("Timeline", timeline(t, j, k))
	if err := j.Scan(Filter{}, func(_ Key, steps []Step) error { check("Scan", steps); return nil }); err != nil {
		t.Errorf("Scan: %v", err)
	}
	if _, err := j.State(k); !errors.Is(err, ErrCorrupt) {
		t.Errorf("State of a hand-off with a damaged record = %v, want ErrCorrupt", err)
	}
}
