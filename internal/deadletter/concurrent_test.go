package deadletter

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// Two replicas close the same dead letters at once: for each, exactly one
// close holds, the other is told it lost (or found it illegal), and both
// replicas end with the same state and history.
func TestConcurrentReplicasAgree(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, false)
	const n = 20
	for i := range n {
		f.dlq.add(NoPartition, t0, deadLetter(fmt.Sprint("ev-", i), "permanent"))
	}
	b := openIndex(t, filepath.Join(t.TempDir(), "b.deadletters"))
	replicas := []*Index{f.x, b}
	for _, x := range replicas {
		if _, err := x.CatchUp(ctx, f.src); err != nil {
			t.Fatal(err)
		}
	}
	wins := make([][2]bool, n)
	var wg sync.WaitGroup
	for r, x := range replicas {
		wg.Go(func() {
			for i := range n {
				id := ID{Log: "orders.dlq", Partition: NoPartition, Offset: int64(i)}
				_, err := x.Apply(ctx, f.src, Change{ID: id, Transition: Terminate, Who: fmt.Sprint("replica-", r)})
				switch {
				case err == nil:
					wins[i][r] = true
				case errors.Is(err, ErrLost) || errors.Is(err, ErrIllegal):
				default:
					t.Errorf("replica %d, letter %d: %v", r, i, err)
				}
			}
		})
	}
	wg.Wait()
	for _, x := range replicas {
		if _, err := x.CatchUp(ctx, f.src); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		id := ID{Log: "orders.dlq", Partition: NoPartition, Offset: int64(i)}
		la, err := f.x.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		lb, err := b.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if la.State != lb.State || len(la.History) != 1 || len(lb.History) != 1 {
			t.Fatalf("letter %d: replicas disagree: %s %+v / %s %+v", i, la.State, la.History, lb.State, lb.History)
		}
		if wins[i][0] == wins[i][1] {
			t.Fatalf("letter %d: wins %v", i, wins[i])
		}
		winner := "replica-0"
		if wins[i][1] {
			winner = "replica-1"
		}
		if la.State != Terminated || la.History[0].Who != winner {
			t.Fatalf("letter %d: %s by %s; %s won", i, la.State, la.History[0].Who, winner)
		}
	}
}
