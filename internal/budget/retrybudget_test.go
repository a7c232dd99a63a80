package budget

import (
	"testing"
	"time"
)

// clock is a manual clock for tests that never sleep.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newClock() *clock { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func TestRetryBudgetRatioOfFirstAttempts(t *testing.T) {
	c := newClock()
	b := NewRetryBudget(0.2, 0, 10*time.Second, c.now)
	if tryWithdraw(b) {
		t.Fatal("a re-attempt got a token with no first attempt and no floor")
	}
	for range 100 {
		b.Deposit()
	}
	got := 0
	for tryWithdraw(b) {
		got++
	}
	if got != 20 {
		t.Errorf("100 first attempts at ratio 0.2 allowed %d re-attempts, want 20", got)
	}
	if st := b.State(); st.Denied != 2 {
		t.Errorf("denials = %d, want 2 (one before the deposits, one after the last token)", st.Denied)
	}
}

func TestRetryBudgetFloorAndWindow(t *testing.T) {
	c := newClock()
	b := NewRetryBudget(0.5, 1, 10*time.Second, c.now)
	// The floor alone: 1 a second over a 10s window.
	got := 0
	for tryWithdraw(b) {
		got++
	}
	if got != 10 {
		t.Fatalf("floor of 1/s over 10s allowed %d, want 10", got)
	}
	// Withdrawals leave the window and give their tokens back; so do
	// deposits, which then no longer count.
	c.advance(5 * time.Second)
	for range 10 {
		b.Deposit()
	}
	if got := drain(b); got != 5 {
		t.Errorf("10 deposits at 0.5 with the window full allowed %d, want 5", got)
	}
	c.advance(10*time.Second + time.Second) // everything above has left the window
	if got := drain(b); got != 10 {
		t.Errorf("after the window passed: %d tokens, want the floor's 10", got)
	}
}

func drain(b *RetryBudget) int {
	n := 0
	for tryWithdraw(b) {
		n++
	}
	return n
}

func TestRetryBudgetZeroAllowsNothing(t *testing.T) {
	c := newClock()
	b := NewRetryBudget(0, 0, 10*time.Second, c.now)
	for range 1000 {
		b.Deposit()
	}
	if tryWithdraw(b) || !b.Exhausted() {
		t.Error("ratio 0 and floor 0 must allow no re-attempt")
	}
}

// tryWithdraw takes a token for a re-attempt, reporting false (and counting
// a denial) when there is none.
func tryWithdraw(b *RetryBudget) bool {
	tok, _, _ := b.Poll(true)
	return tok.Taken()
}

func TestPollWakesOnADeposit(t *testing.T) {
	b := NewRetryBudget(1, 0, 10*time.Second, nil)
	tok, changed, _ := b.Poll(true)
	if tok.Taken() {
		t.Fatal("Poll took a token that was not there")
	}
	select {
	case <-changed:
		t.Fatal("Poll's channel closed with no deposit")
	case <-time.After(50 * time.Millisecond):
	}
	b.Deposit()
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("a deposit did not close Poll's channel")
	}
	if tok, _, _ := b.Poll(false); !tok.Taken() {
		t.Fatal("no token after a deposit at ratio 1")
	}
	if tok, _, _ := b.Poll(false); tok.Taken() {
		t.Error("Poll took a token that was not there")
	}
	if d := b.State().Denied; d != 1 {
		t.Errorf("denials = %d, want 1: only the poll that counts one", d)
	}
	stop := make(chan struct{})
	got := make(chan bool)
	go func() { got <- b.Available(stop) }()
	close(stop)
	if <-got {
		t.Error("Available reported a token that was not there")
	}
}

// Waiters wake when a deposit makes a whole token, not on every deposit.
func TestDepositsWakeOnAWholeToken(t *testing.T) {
	b := NewRetryBudget(0.25, 0, 10*time.Second, nil)
	_, changed, _ := b.Poll(true)
	for i := 1; i <= 3; i++ {
		b.Deposit()
		if isClosed(changed) {
			t.Fatalf("deposit %d of a 0.25 ratio woke the waiters with no whole token", i)
		}
	}
	b.Deposit()
	if !isClosed(changed) {
		t.Fatal("the fourth deposit of a 0.25 ratio made a token and woke no one")
	}
	if tok, _, _ := b.Poll(false); !tok.Taken() {
		t.Fatal("woken, but no token")
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestLimiterAIMD(t *testing.T) {
	l := NewLimiter(64)
	for range 64 {
		if !l.TryAcquire() {
			t.Fatal("could not take 64 slots under a limit of 64")
		}
	}
	if l.TryAcquire() {
		t.Fatal("took a 65th slot")
	}
	// Overload shrinks the limit by a tenth per answer, down to 1.
	for range 64 {
		l.Release(Overload)
	}
	if got := l.Limit(); got != 1 {
		t.Fatalf("limit after 64 overloads = %d, want 1", got)
	}
	// Successes grow it back, about one per limit's worth.
	calls := 0
	for l.Limit() < 64 {
		if !l.TryAcquire() {
			t.Fatal("no slot free with nothing in flight")
		}
		l.Release(Success)
		calls++
	}
	if calls < 64 || calls > 64*64 {
		t.Errorf("recovering from 1 to 64 took %d successes", calls)
	}
	// Answers about the message, not the app, leave it alone.
	l.TryAcquire()
	l.Release(Permanent)
	if got := l.Limit(); got != 64 {
		t.Errorf("limit after a permanent answer = %d, want 64", got)
	}
}

func TestIntakePausesOnlyWhenSpentAndFailing(t *testing.T) {
	tokensLeft := func() bool { return false }
	spent := func() bool { return true }
	in := NewIntake(3)
	for range 3 {
		if in.Observe(Retry, true, tokensLeft) {
			t.Fatal("paused with tokens left")
		}
	}
	if in.Observe(Retry, true, nil) {
		t.Fatal("paused with no budget to spend")
	}
	if in.Observe(Permanent, true, spent) != true || !in.Paused() {
		// A permanent answer is about the message and leaves the streak
		// alone; the failures before it, with the budget spent, pause.
		t.Fatal("not paused with the budget spent after 3 failed first attempts")
	}
	if !in.Observe(Success, false, spent) || in.Paused() {
		t.Fatal("a success did not resume intake")
	}
	if in.Observe(Overload, true, spent) {
		t.Error("paused again after one failure: the streak starts over after a success")
	}
	in.Observe(Retry, false, spent) // a re-attempt: no effect on the streak
	if in.Observe(Retry, false, spent) || in.Paused() {
		t.Error("re-attempts counted in the first attempts' streak")
	}
}

// A refund undoes its withdrawal: a re-attempt that succeeded costs nothing,
// so the budget is spent only by re-attempts that failed.
func TestRefundGivesTheTokenBack(t *testing.T) {
	c := newClock()
	b := NewRetryBudget(0.5, 0, 10*time.Second, c.now)
	for range 4 {
		b.Deposit()
	}
	var toks []Token
	for {
		tok, _, _ := b.Poll(true)
		if !tok.Taken() {
			break
		}
		toks = append(toks, tok)
	}
	if len(toks) != 2 {
		t.Fatalf("4 deposits at 0.5 gave %d tokens, want 2", len(toks))
	}
	// A thousand successful re-attempts, one at a time, on one token.
	b.Refund(toks[0])
	for range 1000 {
		tok, _, _ := b.Poll(true)
		if !tok.Taken() {
			t.Fatal("a refunded token was not there to take again")
		}
		b.Refund(tok)
	}
	if st := b.State(); st.Tokens != 1 {
		t.Errorf("tokens = %v after refunds, want the 1 of the refunded withdrawal", st.Tokens)
	}
	b.Refund(Token{}) // nothing
	if st := b.State(); st.Tokens != 1 {
		t.Errorf("refunding no token changed the balance to %v", st.Tokens)
	}
	// A withdrawal whose bucket has left the window counts no more: its
	// refund must not add a token on top.
	c.advance(11 * time.Second)
	before := b.State().Tokens
	b.Refund(toks[1])
	if after := b.State().Tokens; after != before {
		t.Errorf("refund of a withdrawal outside the window moved the balance %v → %v", before, after)
	}
}

// A refund that makes a whole token wakes the waiters, as a deposit does.
func TestRefundWakesWaiters(t *testing.T) {
	b := NewRetryBudget(1, 0, 10*time.Second, nil)
	b.Deposit()
	tok, _, _ := b.Poll(true)
	if !tok.Taken() {
		t.Fatal("no token after a deposit at ratio 1")
	}
	_, changed, _ := b.Poll(true)
	if isClosed(changed) {
		t.Fatal("waiters woken with no token")
	}
	b.Refund(tok)
	if !isClosed(changed) {
		t.Fatal("a refund made a token and woke no one")
	}
}

func TestTrySpend(t *testing.T) {
	c := newClock()
	b := NewRetryBudget(1, 0, 10*time.Second, c.now)
	if _, ok := b.TrySpend(); ok {
		t.Fatal("TrySpend took a token that was not there")
	}
	if d := b.State().Denied; d != 0 {
		t.Errorf("TrySpend counted %d denials; it is not a re-attempt", d)
	}
	b.Deposit()
	refund, ok := b.TrySpend()
	if !ok {
		t.Fatal("TrySpend found no token after a deposit at ratio 1")
	}
	if !b.Exhausted() {
		t.Fatal("the spent token is still there")
	}
	refund()
	if b.Exhausted() {
		t.Fatal("the refund did not give the token back")
	}
}
