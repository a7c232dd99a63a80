package budget

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Callers that find no slot queue for one: a freed slot goes to the first in
// line and to no one else, a newcomer never takes it ahead of them, and a
// waiter that leaves is skipped.
func TestLimiterQueue(t *testing.T) {
	l := NewLimiter(2)
	for range 2 {
		if _, ok := l.Acquire(); !ok {
			t.Fatal("no slot free under a limit of 2 with nothing in flight")
		}
	}
	var q []*Waiter
	for range 4 {
		w, ok := l.Acquire()
		if ok {
			t.Fatal("took a third slot under a limit of 2")
		}
		q = append(q, w)
	}
	l.Release(Permanent)
	if !isClosed(q[0].Ready()) || isClosed(q[1].Ready()) {
		t.Fatal("a freed slot did not go to the first in line alone")
	}
	if l.TryAcquire() {
		t.Fatal("a newcomer took a slot while callers were queued")
	}
	q[1].Cancel()
	q[1].Cancel() // twice: still one waiter gone
	if got := l.Queued(); got != 2 {
		t.Fatalf("queued = %d after one of three left, want 2", got)
	}
	l.Release(Permanent)
	if isClosed(q[1].Ready()) || !isClosed(q[2].Ready()) {
		t.Fatal("a slot went to a waiter that had left, not to the next in line")
	}
	// A waiter that leaves after its slot came frees the slot for the next.
	q[2].Cancel()
	if !isClosed(q[3].Ready()) {
		t.Fatal("the slot of a waiter that left after it came did not pass on")
	}
	q[2].Cancel() // twice: the slot is not freed again
	if n, w := l.InFlight(), l.Queued(); n != 2 || w != 0 {
		t.Fatalf("in flight %d, queued %d; want 2 and 0", n, w)
	}
}

// A limit that grows serves as many queued callers as it has room for.
func TestLimiterGrowthServesTheQueue(t *testing.T) {
	l := NewLimiter(4)
	for range 4 {
		l.TryAcquire()
	}
	for range 3 {
		l.Release(Overload) // 4 → 3 → 2 → 1
	}
	if got := l.Limit(); got != 1 {
		t.Fatalf("limit = %d, want 1", got)
	}
	a, _ := l.Acquire()
	b, _ := l.Acquire()
	l.Release(Success) // 1 → 2, and the one in flight is done
	if !isClosed(a.Ready()) || !isClosed(b.Ready()) {
		t.Fatalf("a limit of 2 with nothing in flight served a=%v b=%v, want both", isClosed(a.Ready()), isClosed(b.Ready()))
	}
}

// Under churn — waits, leaves before and after a slot came, answers that
// move the limit both ways, from many goroutines — no more than the limit's
// ceiling are ever in flight, and when everyone has left no slot is taken and
// nobody is queued.
func TestLimiterChurn(t *testing.T) {
	const ceiling = 8
	l := NewLimiter(ceiling)
	outcomes := []Outcome{Success, Success, Success, Overload, Unknown, Permanent, 0}
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			// Half of them wait with one waiter of their own, reused
			// (AcquireAgain) until they cancel it.
			var mine *Waiter
			for range 300 {
				var w *Waiter
				var ok bool
				if g%2 == 1 {
					if mine == nil {
						mine = l.NewWaiter()
					}
					w, ok = mine, l.AcquireAgain(mine)
				} else {
					w, ok = l.Acquire()
				}
				if !ok && w == mine && r.IntN(3) == 0 {
					mine = nil // cancelled below: not queued again
				}
				if !ok {
					switch r.IntN(6) {
					case 0:
						w.Cancel() // gives up, slot or not
						mine = nil
						continue
					case 1:
						<-w.Ready()
						w.Cancel() // the slot came, and is not wanted after all
						mine = nil
						continue
					}
					<-w.Ready()
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				if r.IntN(8) == 0 {
					time.Sleep(time.Microsecond)
				}
				inside.Add(-1)
				l.Release(outcomes[r.IntN(len(outcomes))])
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m > ceiling {
		t.Errorf("%d in flight at once under a ceiling of %d", m, ceiling)
	}
	if n, q := l.InFlight(), l.Queued(); n != 0 || q != 0 {
		t.Errorf("after everyone left: %d slots taken, %d queued; want none", n, q)
	}
	if !l.TryAcquire() {
		t.Error("no slot free after everyone left")
	}
}

// A caller that waits for one slot at a time reuses one waiter: it is
// served in its turn among the others, its wait allocates nothing, and one
// cancelled with its slot signalled and not received frees the slot.
func TestLimiterReusedWaiter(t *testing.T) {
	l := NewLimiter(1)
	if !l.TryAcquire() {
		t.Fatal("no slot free")
	}
	w := l.NewWaiter()
	other, _ := l.Acquire()
	if l.AcquireAgain(w) {
		t.Fatal("took a slot with none free")
	}
	l.Release(Success)
	if !isClosed(other.Ready()) {
		t.Fatal("the slot did not go to the first in line")
	}
	l.Release(Success)
	select {
	case <-w.Ready():
	default:
		t.Fatal("the reused waiter was not served in its turn")
	}
	allocs := testing.AllocsPerRun(100, func() {
		if l.AcquireAgain(w) {
			t.Fatal("took a slot with none free")
		}
		l.Release(Success)
		<-w.Ready()
	})
	if allocs != 0 {
		t.Errorf("%v allocations a wait with a reused waiter, want none", allocs)
	}
	if l.AcquireAgain(w) {
		t.Fatal("took a slot with none free")
	}
	l.Release(Success) // signalled, not received
	w.Cancel()
	if n, q := l.InFlight(), l.Queued(); n != 0 || q != 0 {
		t.Fatalf("in flight %d, queued %d after the waiter gave its slot back; want none", n, q)
	}
	select {
	case <-w.Ready():
		t.Fatal("a cancelled waiter's signal was left to receive")
	default:
	}
}
