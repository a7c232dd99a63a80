package budget

import (
	"testing"
	"time"
)

// Hot-path pieces: every hand-off passes through Decide, the limiter, and
// (for each attempt) the retry budget.

func BenchmarkDecide(b *testing.B) {
	p := &Policy{MaxAttempts: 4, Base: 100 * time.Millisecond, Cap: 2 * time.Second,
		Tiers: []time.Duration{time.Second, 10 * time.Second}, Deadline: time.Hour, DeferMaxAge: time.Hour,
		MinAttempt: 100 * time.Millisecond, Jitter: func() float64 { return 0.5 }}
	now := time.Now()
	in := Input{Outcome: Retry, Attempt: 1, FirstAttemptAt: now, Deadline: now.Add(time.Hour), Now: now}
	b.ReportAllocs()
	for b.Loop() {
		_ = p.Decide(in)
	}
}

func BenchmarkRetryBudgetDepositWithdraw(b *testing.B) {
	rb := NewRetryBudget(0.2, 10, 10*time.Second, nil)
	b.ReportAllocs()
	for b.Loop() {
		rb.Deposit()
		_, _, _ = rb.Poll(true)
	}
}

func BenchmarkLimiterAcquireRelease(b *testing.B) {
	l := NewLimiter(64)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			for !l.TryAcquire() {
			}
			l.Release(Success)
		}
	})
}
