package budget

import (
	"sync"
	"time"
)

// RetryBudget is one handler's shared allowance of re-attempts, in the manner
// of Finagle's RetryBudget and gRPC's retry throttling: every first attempt
// deposits Ratio tokens, every re-attempt withdraws one, and a reserve of
// Floor tokens a second is always there, all over a sliding window. A
// re-attempt that succeeds gives its token back (Refund): it was useful work,
// not amplification. So within any window
//
//	failed re-attempts <= Ratio × first attempts + Floor × Window
//
// (plus the re-attempts still in flight, which hold their tokens until they
// answer) however many messages fail at once: failing retries add at most
// Ratio to the load that fresh traffic brings (seed 001 §2). Once the app
// answers again, though, the waiting re-attempts drain at the pace it takes
// them — bounded by the concurrency limit — and not at the floor's.
//
// A re-attempt that finds no token waits for one; it is never dropped for
// lack of one. RetryBudget is safe for concurrent use; it reads time only
// through its clock, so tests drive it without sleeping.
type RetryBudget struct {
	ratio, floor float64
	window       time.Duration
	slot         time.Duration // one bucket's span
	now          func() time.Time

	mu      sync.Mutex
	buckets []bucket // a ring, indexed by slot number modulo its length
	denied  uint64
	changed chan struct{} // closed and replaced when a deposit makes a token
	waiting bool          // someone holds changed
}

// Token is one withdrawal: a re-attempt's claim on the budget, which Refund
// gives back. The zero Token is no withdrawal.
type Token struct {
	slot int64 // the slot number of the bucket it was taken from, plus one
}

// Taken reports whether t is a withdrawal.
func (t Token) Taken() bool { return t.slot > 0 }

type bucket struct {
	n           int64 // the slot number this bucket holds; -1 when empty
	deposits    float64
	withdrawals float64
}

// budgetSlots is how many buckets the window is cut into: the window slides
// in steps of Window/budgetSlots.
const budgetSlots = 20

// NewRetryBudget returns a budget; now nil means time.Now.
func NewRetryBudget(ratio, floor float64, window time.Duration, now func() time.Time) *RetryBudget {
	if now == nil {
		now = time.Now
	}
	window = max(window, budgetSlots*time.Millisecond)
	b := &RetryBudget{ratio: ratio, floor: floor, window: window, slot: window / budgetSlots, now: now,
		buckets: make([]bucket, budgetSlots), changed: make(chan struct{})}
	for i := range b.buckets {
		b.buckets[i].n = -1
	}
	return b
}

// current returns the bucket for now, emptying it if it held an older slot.
func (b *RetryBudget) current() *bucket {
	n := b.now().UnixNano() / int64(b.slot)
	bk := &b.buckets[n%budgetSlots]
	if bk.n != n {
		*bk = bucket{n: n}
	}
	return bk
}

// balanceLocked is the tokens available now.
func (b *RetryBudget) balanceLocked() float64 {
	n := b.now().UnixNano() / int64(b.slot)
	var dep, wd float64
	for _, bk := range b.buckets {
		if bk.n > n-budgetSlots && bk.n <= n {
			dep += bk.deposits
			wd += bk.withdrawals
		}
	}
	return b.floor*b.window.Seconds() + b.ratio*dep - wd
}

// Deposit records a first attempt. It wakes the waiters only once the
// balance reaches a whole token: from an empty budget at a ratio of 0.1, one
// deposit in ten.
func (b *RetryBudget) Deposit() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.current().deposits++
	if b.ratio > 0 {
		b.wakeLocked()
	}
}

// wakeLocked closes the channel the waiters hold once there is a whole token.
func (b *RetryBudget) wakeLocked() {
	if b.waiting && b.balanceLocked() >= 1 {
		close(b.changed)
		b.changed = make(chan struct{})
		b.waiting = false
	}
}

// Refund gives back t, taken by a re-attempt that succeeded: the withdrawal
// is undone in the bucket it was taken from, as if it never happened. A
// token whose bucket has left the window counts no more anyway. Refunding
// the zero Token, or one twice, is the caller's bug; the first does nothing.
func (b *RetryBudget) Refund(t Token) {
	if !t.Taken() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := t.slot - 1
	bk := &b.buckets[n%budgetSlots]
	if bk.n != n || bk.withdrawals < 1 {
		return
	}
	bk.withdrawals--
	b.wakeLocked()
}

// Poll takes a token for a re-attempt or, when there is none, returns the
// channel closed by the next deposit or refund that makes a whole token, and
// how long until old withdrawals may leave the window: for a caller that
// waits on more than the budget in one select. Only the first poll of a wait
// should count its denial.
func (b *RetryBudget) Poll(countDenial bool) (tok Token, changed <-chan struct{}, recheck time.Duration) {
	_, tok, changed = b.check(true, countDenial)
	return tok, changed, b.slot
}

// TrySpend takes a token without waiting, for an extra call that is not a
// message's own re-attempt (a failed batch split in two); refund gives it
// back when that call succeeded. It counts no denial.
func (b *RetryBudget) TrySpend() (refund func(), ok bool) {
	ok, tok, _ := b.check(true, false)
	if !ok {
		return nil, false
	}
	return func() { b.Refund(tok) }, true
}

// check reports whether a token is there, taking it when take is set (the
// Token is then the withdrawal); when there is none it returns the channel
// that a deposit or refund making one closes.
func (b *RetryBudget) check(take, countDenial bool) (bool, Token, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.balanceLocked() < 1 {
		if countDenial {
			b.denied++
		}
		b.waiting = true
		return false, Token{}, b.changed
	}
	if !take {
		return true, Token{}, nil
	}
	bk := b.current()
	bk.withdrawals++
	return true, Token{slot: bk.n + 1}, nil
}

// Available waits until a token is there, without taking it: for intake
// that should not take a re-attempt it could not start. It reports false when
// stop is closed first. Tokens come back when a first attempt deposits or
// when old withdrawals leave the window, so it also wakes every slot.
func (b *RetryBudget) Available(stop <-chan struct{}) bool {
	for {
		ok, _, changed := b.check(false, false)
		if ok {
			return true
		}
		t := time.NewTimer(b.slot)
		select {
		case <-changed:
		case <-t.C:
		case <-stop:
			t.Stop()
			return false
		}
		t.Stop()
	}
}

// BudgetState is a reading of a budget, for logs and metrics.
type BudgetState struct {
	Tokens float64 // available now
	Denied uint64  // re-attempts that found no token, since the start
}

// State reads the budget.
func (b *RetryBudget) State() BudgetState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BudgetState{Tokens: b.balanceLocked(), Denied: b.denied}
}

// Exhausted reports whether a re-attempt would find no token now.
func (b *RetryBudget) Exhausted() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.balanceLocked() < 1
}
