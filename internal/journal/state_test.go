package journal

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"
)

func TestState(t *testing.T) {
	trail := map[string]string{"handoff-hops": "1", "handoff-reason": "http 503"}
	copyHop1 := func(confirmed bool) *Copy {
		return &Copy{Hop: 1, Dest: "retry.1s", Attempt: 1, Trail: trail, Confirmed: confirmed}
	}
	hop0 := []Record{
		{Kind: Received, At: at(0)},
		{Kind: Attempt, At: at(1 * time.Second), Attempt: 1},
		{Kind: Outcome, At: at(2 * time.Second), Attempt: 1, Outcome: outRetry, Status: 503, Detail: "http 503"},
		{Kind: Transferring, At: at(3 * time.Second), Hop: 1, Attempt: 1, Dest: "retry.1s", Trail: trail},
		{Kind: Transferred, At: at(4 * time.Second), Hop: 1},
		{Kind: Settled, At: at(5 * time.Second), Detail: "copied"},
	}
	then := func(recs ...Record) []Record { return append(append([]Record(nil), hop0...), recs...) }

	tests := []struct {
		name        string
		recs        []Record
		want        State // Last is checked by kind only
		wantLast    Kind
		wantHandled bool
	}{
		{
			name: "nothing written",
			want: State{},
		},
		{
			name:     "received only",
			recs:     []Record{{Kind: Received, At: at(0)}},
			want:     State{Found: true},
			wantLast: Received,
		},
		{
			name: "success, not settled",
			recs: []Record{
				{Kind: Received, At: at(0)},
				{Kind: Attempt, At: at(time.Second), Attempt: 1},
				{Kind: Outcome, At: at(2 * time.Second), Attempt: 1, Outcome: outSuccess, Status: 200, Detail: "ok"},
			},
			want:        State{Found: true, Attempts: 1, FirstAttemptAt: at(time.Second), HopAttempt: 1, HopOutcome: outSuccess, HopDetail: "ok"},
			wantLast:    Outcome,
			wantHandled: true,
		},
		{
			name: "success, settled",
			recs: storySettledSuccess(at(0)),
			want: State{Found: true, Attempts: 1, FirstAttemptAt: at(time.Millisecond), HopAttempt: 1, HopOutcome: outSuccess, Settled: true},
			// Handled stays true after the settle: a redelivery must not run again.
			wantLast:    Settled,
			wantHandled: true,
		},
		{
			name: "dropped is handled",
			recs: []Record{
				{Kind: Received, At: at(0)},
				{Kind: Attempt, At: at(time.Second), Attempt: 1},
				{Kind: Outcome, At: at(2 * time.Second), Attempt: 1, Outcome: outDrop, Detail: "poison"},
			},
			want:        State{Found: true, Attempts: 1, FirstAttemptAt: at(time.Second), HopAttempt: 1, HopOutcome: outDrop, HopDetail: "poison"},
			wantLast:    Outcome,
			wantHandled: true,
		},
		{
			name:     "failure, copy confirmed, settled",
			recs:     hop0,
			want:     State{Found: true, Attempts: 1, FirstAttemptAt: at(time.Second), HopAttempt: 1, HopOutcome: outRetry, HopDetail: "http 503", Copy: copyHop1(true), Settled: true},
			wantLast: Settled,
		},
		{
			name:     "failure, copy not confirmed",
			recs:     hop0[:4],
			want:     State{Found: true, Attempts: 1, FirstAttemptAt: at(time.Second), HopAttempt: 1, HopOutcome: outRetry, HopDetail: "http 503", Copy: copyHop1(false)},
			wantLast: Transferring,
		},
		{
			name:     "confirm of another hop does not confirm the copy",
			recs:     append(append([]Record(nil), hop0[:4]...), Record{Kind: Transferred, At: at(4 * time.Second), Hop: 2}),
			want:     State{Found: true, Attempts: 1, FirstAttemptAt: at(time.Second), HopAttempt: 1, HopOutcome: outRetry, HopDetail: "http 503", Copy: copyHop1(false)},
			wantLast: Transferred,
		},
		{
			name: "crash mid-call",
			recs: []Record{
				{Kind: Received, At: at(0)},
				{Kind: Attempt, At: at(time.Second), Attempt: 1},
			},
			want:     State{Found: true, Attempts: 1, FirstAttemptAt: at(time.Second), HopAttempt: 1},
			wantLast: Attempt,
		},
		{
			name: "redelivery after a crash mid-call starts attempt 2",
			recs: []Record{
				{Kind: Received, At: at(0)},
				{Kind: Attempt, At: at(time.Second), Attempt: 1},
				{Kind: Received, At: at(time.Minute)},
				{Kind: Attempt, At: at(time.Minute + time.Second), Attempt: 2},
				{Kind: Outcome, At: at(time.Minute + 2*time.Second), Attempt: 2, Outcome: outSuccess},
			},
			want:        State{Found: true, Attempts: 2, FirstAttemptAt: at(time.Second), HopAttempt: 2, HopOutcome: outSuccess},
			wantLast:    Outcome,
			wantHandled: true,
		},
		{
			name:        "redelivery of a handled hop keeps its outcome",
			recs:        append(storyHandled(at(0)), Record{Kind: Received, At: at(time.Minute)}),
			want:        State{Found: true, Attempts: 1, FirstAttemptAt: at(time.Millisecond), HopAttempt: 1, HopOutcome: outSuccess},
			wantLast:    Received,
			wantHandled: true,
		},
		{
			name: "outcome of an earlier attempt is not the current one's",
			recs: []Record{
				{Kind: Received, At: at(0)},
				{Kind: Attempt, At: at(time.Second), Attempt: 1},
				{Kind: Attempt, At: at(2 * time.Second), Attempt: 2},
				{Kind: Outcome, At: at(3 * time.Second), Attempt: 1, Outcome: outSuccess},
			},
			want:     State{Found: true, Attempts: 2, FirstAttemptAt: at(time.Second), HopAttempt: 2},
			wantLast: Outcome,
		},
		{
			name:     "later hop received resets the hop fields",
			recs:     then(Record{Kind: Received, At: at(time.Minute), Hop: 1}),
			want:     State{Found: true, Hop: 1, Attempts: 1, FirstAttemptAt: at(time.Second), Copy: copyHop1(true)},
			wantLast: Received,
		},
		{
			name: "later hop in a call",
			recs: then(
				Record{Kind: Received, At: at(time.Minute), Hop: 1},
				Record{Kind: Attempt, At: at(time.Minute + time.Second), Hop: 1, Attempt: 2},
			),
			want:     State{Found: true, Hop: 1, Attempts: 2, FirstAttemptAt: at(time.Second), HopAttempt: 2, Copy: copyHop1(true)},
			wantLast: Attempt,
		},
		{
			name: "later hop handled and settled",
			recs: then(
				Record{Kind: Received, At: at(time.Minute), Hop: 1},
				Record{Kind: Attempt, At: at(time.Minute + time.Second), Hop: 1, Attempt: 2},
				Record{Kind: Outcome, At: at(time.Minute + 2*time.Second), Hop: 1, Attempt: 2, Outcome: outSuccess, Detail: "ok"},
				Record{Kind: Settled, At: at(time.Minute + 3*time.Second), Hop: 1},
			),
			want:        State{Found: true, Hop: 1, Attempts: 2, FirstAttemptAt: at(time.Second), HopAttempt: 2, HopOutcome: outSuccess, HopDetail: "ok", Copy: copyHop1(true), Settled: true},
			wantLast:    Settled,
			wantHandled: true,
		},
		{
			name: "attempts keeps the highest number",
			recs: then(
				Record{Kind: Received, At: at(time.Minute), Hop: 1},
				Record{Kind: Attempt, At: at(time.Minute + time.Second), Hop: 1, Attempt: 5},
				Record{Kind: Received, At: at(2 * time.Minute), Hop: 1},
				Record{Kind: Attempt, At: at(2*time.Minute + time.Second), Hop: 1, Attempt: 3},
			),
			want:     State{Found: true, Hop: 1, Attempts: 5, FirstAttemptAt: at(time.Second), HopAttempt: 3, Copy: copyHop1(true)},
			wantLast: Attempt,
		},
		{
			name: "late records of the earlier hop do not touch the later one",
			recs: then(
				Record{Kind: Received, At: at(time.Minute), Hop: 1},
				Record{Kind: Attempt, At: at(time.Minute + time.Second), Attempt: 9},
				Record{Kind: Outcome, At: at(time.Minute + 2*time.Second), Attempt: 9, Outcome: outSuccess},
				Record{Kind: Settled, At: at(time.Minute + 3*time.Second)},
				Record{Kind: Received, At: at(time.Minute + 4*time.Second)},
			),
			want:     State{Found: true, Hop: 1, Attempts: 9, FirstAttemptAt: at(time.Second), Copy: copyHop1(true)},
			wantLast: Received,
		},
		{
			name:        "released leaves the hop open",
			recs:        append(storyHandled(at(0)), Record{Kind: Released, At: at(time.Second), Detail: "shutdown"}),
			want:        State{Found: true, Attempts: 1, FirstAttemptAt: at(time.Millisecond), HopAttempt: 1, HopOutcome: outSuccess, HopReleased: true},
			wantLast:    Released,
			wantHandled: true,
		},
		{
			// The process stopped during an alone call: no outcome, no
			// release, and the attempt says it was alone.
			name:     "an alone attempt cut by a crash",
			recs:     []Record{{Kind: Received, At: at(0)}, {Kind: Attempt, At: at(time.Millisecond), Attempt: 1, Detail: AttemptAlone}},
			want:     State{Found: true, Attempts: 1, FirstAttemptAt: at(time.Millisecond), HopAttempt: 1, HopAlone: true},
			wantLast: Attempt,
		},
	}
	j, _ := openJournal(t, newPath(t), Options{})
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The same story written one record per Append and all in one
			// Append folds the same way.
			oneByOne := Key{Source: "one-by-one", EventID: fmt.Sprint(i)}
			together := Key{Source: "together", EventID: fmt.Sprint(i)}
			for _, r := range tt.recs {
				appendOK(t, j, oneByOne, r)
			}
			if len(tt.recs) > 0 {
				appendOK(t, j, together, append([]Record(nil), tt.recs...)...)
			}
			for _, k := range []Key{oneByOne, together} {
				got, err := j.State(k)
				if err != nil {
					t.Fatalf("State(%s): %v", k, err)
				}
				checkState(t, k, got, tt.want, tt.wantLast, tt.wantHandled)
			}
		})
	}
}

func checkState(t *testing.T, k Key, got, want State, wantLast Kind, wantHandled bool) {
	t.Helper()
	if got.Last.Kind != wantLast {
		t.Errorf("%s: Last.Kind = %v, want %v", k, got.Last.Kind, wantLast)
	}
	if h := got.Handled(); h != wantHandled {
		t.Errorf("%s: Handled() = %v, want %v", k, h, wantHandled)
	}
	if !got.FirstAttemptAt.Equal(want.FirstAttemptAt) {
		t.Errorf("%s: FirstAttemptAt = %v, want %v", k, got.FirstAttemptAt, want.FirstAttemptAt)
	}
	got.Last, got.FirstAttemptAt, want.FirstAttemptAt = Record{}, time.Time{}, time.Time{}
	if got.Copy != nil && want.Copy != nil {
		// The copy's time is its TRANSFERRING record's; the stories here
		// check what the copy is, not when.
		c := *got.Copy
		c.At = want.Copy.At
		got.Copy = &c
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: State =\n%+v\nwant\n%+v (copy %+v, want %+v)", k, got, want, got.Copy, want.Copy)
	}
}

// TestStateKeysAreIsolated writes a story under keys that differ only in
// ways a naive key layout would confuse, and reads each back alone.
func TestStateKeysAreIsolated(t *testing.T) {
	path := newPath(t)
	j, _ := openJournal(t, path, Options{})
	// Key i gets i+1 attempts, each with the key in its detail, so a
	// record that strays into another key's timeline is seen.
	write := func(i int, k Key) {
		recs := []Record{{Kind: Received, At: at(0), Detail: k.String()}}
		for a := 1; a <= i+1; a++ {
			recs = append(recs, Record{Kind: Attempt, At: at(time.Duration(a) * time.Second), Attempt: a, Detail: k.String()})
		}
		appendOK(t, j, k, recs[:1]...)
		appendOK(t, j, k, recs[1:]...)
	}
	// Write in reverse of key order, so that sequence order and key order
	// disagree.
	for i := len(trickyKeys) - 1; i >= 0; i-- {
		write(i, trickyKeys[i])
	}
	check := func(t *testing.T, j *Journal) {
		for i, k := range trickyKeys {
			t.Run(fmt.Sprintf("%d %q", i, k.String()), func(t *testing.T) {
				steps := timeline(t, j, k)
				if len(steps) != i+2 {
					t.Errorf("Timeline has %d steps, want %d", len(steps), i+2)
				}
				for _, s := range steps {
					if s.Key != k || s.Detail != k.String() {
						t.Errorf("step %d of %q: key %q, detail %q", s.Seq, k, s.Key, s.Detail)
					}
				}
				st, err := j.State(k)
				if err != nil {
					t.Fatalf("State: %v", err)
				}
				if st.Attempts != i+1 || st.HopAttempt != i+1 || st.Last.Detail != k.String() {
					t.Errorf("State = %+v, want %d attempts and detail %q", st, i+1, k.String())
				}
			})
		}
		// A key nobody wrote, next to many that were, is not found.
		for _, k := range []Key{{Source: "orders", EventID: "a\x00\x00"}, {Source: "orders", EventID: "b"}, {Source: "order"}, {Source: "orders", EventID: "a", ReplayID: "r"}} {
			if st, err := j.State(k); err != nil || st.Found {
				t.Errorf("State(%q) = %+v, %v; want not found", k, st, err)
			}
			if steps := timeline(t, j, k); len(steps) != 0 {
				t.Errorf("Timeline(%q) = %d steps, want none", k, len(steps))
			}
		}
	}
	t.Run("open", func(t *testing.T) { check(t, j) })
	j, rec := reopen(t, j, Options{})
	t.Run("reopened", func(t *testing.T) { check(t, j) })
	if rec.Open != len(trickyKeys) || rec.InCall != len(trickyKeys) {
		t.Errorf("Recovery = %+v, want %d open, all in a call", rec, len(trickyKeys))
	}
}

// TestAppendStampsTime checks that a record without a time gets the clock's.
func TestAppendStampsTime(t *testing.T) {
	clock := newFakeClock()
	j, _ := openJournal(t, newPath(t), Options{Now: clock.Now})
	k := Key{Source: "s", EventID: "e"}
	explicit := at(-time.Hour)
	if err := j.Append(context.Background(), k, Record{Kind: Received}, Record{Kind: Attempt, Attempt: 1, At: explicit}); err != nil {
		t.Fatal(err)
	}
	steps := timeline(t, j, k)
	if len(steps) != 2 {
		t.Fatalf("Timeline has %d steps, want 2", len(steps))
	}
	if !steps[0].At.Equal(clock.Now()) {
		t.Errorf("record without time: At = %v, want the clock's %v", steps[0].At, clock.Now())
	}
	if !steps[1].At.Equal(explicit) {
		t.Errorf("record with time: At = %v, want %v", steps[1].At, explicit)
	}
}
