package journal

import (
	"testing"
	"time"
)

func TestEvent(t *testing.T) {
	j := queryFixture(t)
	tests := []struct {
		name, source, event string
		want                []string // Key.String of each hand-off, in order
	}{
		{name: "one hand-off", source: "a", event: "e1", want: []string{"a/e1"}},
		{name: "the original, then its replay", source: "b", event: "e1", want: []string{"b/e1", "b/e1@r1"}},
		{name: "event is matched exactly, not by prefix", source: "a", event: "e", want: []string{"a/e"}},
		{name: "source is matched exactly", source: "", event: "e1"},
		{name: "unknown event", source: "a", event: "e2"},
		{name: "unknown source", source: "z", event: "e1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := j.Event(tt.source, tt.event)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("%d hand-offs, want %v", len(got), tt.want)
			}
			for i, steps := range got {
				k := steps[0].Key
				if k.String() != tt.want[i] {
					t.Errorf("hand-off %d is %s, want %s", i, k, tt.want[i])
				}
				// The same timeline Timeline reads.
				tl, err := j.Timeline(k)
				if err != nil {
					t.Fatal(err)
				}
				if len(tl) != len(steps) {
					t.Errorf("%s: %d steps, Timeline has %d", k, len(steps), len(tl))
				}
				for n := range min(len(tl), len(steps)) {
					if tl[n].Seq != steps[n].Seq || tl[n].Kind != steps[n].Kind || steps[n].Key != k {
						t.Errorf("%s step %d: %+v, Timeline has %+v", k, n, steps[n], tl[n])
					}
				}
			}
		})
	}
}

func TestStats(t *testing.T) {
	j := queryFixture(t)
	st, err := j.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// b/e1, b/e1@r1, a/e and c/e1 are not settled.
	if st.Open != 4 {
		t.Errorf("Open = %d, want 4", st.Open)
	}
	if st.Path != j.Path() || st.Size <= 0 {
		t.Errorf("Path %q, Size %d", st.Path, st.Size)
	}
	if c := st.Commits; c.N == 0 || c.Max <= 0 || c.P50 > c.Max {
		t.Errorf("Commits = %+v: want some, median at most the slowest", c)
	}
}

func TestCommitLatency(t *testing.T) {
	var c commits
	if got := c.latency(); got != (CommitLatency{}) {
		t.Errorf("before any commit: %+v", got)
	}
	for _, ms := range []int{5, 1, 3} {
		c.record(msDuration(ms))
	}
	if got, want := c.latency(), (CommitLatency{P50: msDuration(3), Max: msDuration(5), N: 3}); got != want {
		t.Errorf("latency = %+v, want %+v", got, want)
	}
	// Only the latest commitWindow count.
	for range commitWindow {
		c.record(msDuration(2))
	}
	if got, want := c.latency(), (CommitLatency{P50: msDuration(2), Max: msDuration(2), N: commitWindow}); got != want {
		t.Errorf("after a full window: %+v, want %+v", got, want)
	}
}

func msDuration(ms int) time.Duration { return time.Duration(ms) * time.Millisecond }
