package journal

import (
	"fmt"
	"testing"
	"time"
)

// TestTailPlacedAfterDropAndRestart: an event handed off again after its
// first parts were dropped (by retention here; max_size drops the same way)
// is still known after a restart. Open places the tail's parts by the parts
// that name their events in full; those must not be among the dropped ones,
// whether the event's earlier parts were sealed in a segment before the drop
// or were in the tail the drop cut into.
func TestTailPlacedAfterDropAndRestart(t *testing.T) {
	for _, c := range []struct {
		name   string
		seal   int // sealAt
		events int // written at first, all dropped later
	}{
		{"earlier parts sealed", 64, 4*64 + 40},
		{"drop cuts into the tail", 1 << 16, 300},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func(n int) { sealAt = n }(sealAt)
			sealAt = c.seal
			clock := newFakeClock()
			o := Options{Now: clock.Now, Retention: time.Hour, Sync: SyncNone}
			j, _ := openJournal(t, newPath(t), o)
			var keys []Key
			for i := range c.events {
				k := Key{Source: "s", EventID: fmt.Sprintf("e-%05d", i)}
				keys = append(keys, k)
				appendOK(t, j, k, storySettledSuccess(clock.Now())...)
			}
			// Half of them come back two hours on: a later hand-off's
			// records, linked to parts retention then drops.
			clock.Advance(2 * time.Hour)
			back := keys[len(keys)/2:]
			for _, k := range back {
				appendOK(t, j, k, Record{Kind: Received, At: clock.Now()}, Record{Kind: Settled, At: clock.Now(), Detail: "duplicate"})
			}
			if n, err := j.Compact(); err != nil || n == 0 {
				t.Fatalf("Compact = %d, %v; want the first hand-offs dropped", n, err)
			}
			missing := func(when string) {
				t.Helper()
				for _, k := range back {
					st, err := j.State(k)
					if err != nil {
						t.Fatal(err)
					}
					if !st.Found {
						t.Fatalf("%s: %s unknown to the journal", when, k.EventID)
					}
				}
			}
			missing("before a restart")
			j, _ = reopen(t, j, o)
			missing("after a restart")
			for _, k := range keys[:len(keys)/2] {
				if st, _ := j.State(k); st.Found {
					t.Fatalf("%s, dropped by retention, still known", k.EventID)
				}
			}
		})
	}
}
