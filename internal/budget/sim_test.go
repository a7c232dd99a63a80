package budget

import (
	"math/rand"
	"testing"
	"time"
)

// TestRetryStormSimulation plays, on a manual clock, the storm of seed 001
// §2: 10,000 messages arrive at 100 a second; the app fails every call for
// the first 60 s, then handles everything. The sidecar's parts are the real
// ones — RetryBudget, Limiter, Intake, Policy.Decide — wired as the engine
// wires them: a first attempt deposits, a re-attempt waits for a token, a
// failing first attempt with the budget spent pauses fresh intake (one probe
// a second), a success resumes it. The app never sees retries multiply its
// load: re-attempts stay within ratio × first attempts + floor × time (+ one
// concurrency window), and no message is lost or dead-lettered.
func TestRetryStormSimulation(t *testing.T) {
	const (
		messages    = 10000
		rate        = 100 // fresh messages a second
		ratio       = 0.2
		floor       = 10.0 // tokens a second
		concurrency = 64
		latency     = 20 * time.Millisecond
		outage      = 60 * time.Second
		step        = 10 * time.Millisecond
	)
	c := newClock()
	start := c.now()
	rng := rand.New(rand.NewSource(1))
	pol := &Policy{MaxAttempts: 1000, Base: 100 * time.Millisecond, Cap: 2 * time.Second,
		Tiers:    []time.Duration{time.Second, 10 * time.Second, time.Minute},
		Deadline: time.Hour, DeferMaxAge: 24 * time.Hour, MinAttempt: 100 * time.Millisecond, Jitter: rng.Float64}
	b := NewRetryBudget(ratio, floor, 10*time.Second, c.now)
	lim := NewLimiter(concurrency)
	intake := NewIntake(concurrency)

	type msg struct {
		attempt int
		first   time.Time
		due     time.Time
	}
	type call struct {
		m   *msg
		end time.Time
	}
	var (
		backlog []*msg // in the broker: produced, not taken
		retries []*msg // copies waiting in delay tiers / the retry queue
		calls   []call
		done    int
		dead    int
		// per phase: [0] the outage, [1] the minute after it
		fresh, again [2]int
		nextProbe    time.Time
		produced     int
	)
	phase := func(now time.Time) int {
		if now.Sub(start) < outage {
			return 0
		}
		if now.Sub(start) < 2*outage {
			return 1
		}
		return -1
	}
	count := func(arr *[2]int, now time.Time) {
		if p := phase(now); p >= 0 {
			arr[p]++
		}
	}
	for now := c.now(); done+dead < messages; now = c.now() {
		if now.Sub(start) > 2*time.Hour {
			t.Fatalf("not drained after 2h: %d done, %d dead, %d in backlog, %d retries", done, dead, len(backlog), len(retries))
		}
		// Arrivals.
		for want := min(int(now.Sub(start).Seconds()*rate)+1, messages); produced < want; produced++ {
			backlog = append(backlog, &msg{})
		}
		// Answers.
		kept := calls[:0]
		for _, cl := range calls {
			if now.Before(cl.end) {
				kept = append(kept, cl)
				continue
			}
			o := Overload
			if now.Sub(start) >= outage {
				o = Success
			}
			lim.Release(o)
			intake.Observe(o, cl.m.attempt == 1)
			intake.Check(b.Exhausted)
			d := pol.Decide(Input{Outcome: o, Attempt: cl.m.attempt, FirstAttemptAt: cl.m.first,
				Deadline: cl.m.first.Add(pol.Deadline), Now: now})
			switch d.Action {
			case Ack:
				done++
			case Delay:
				cl.m.due = d.Due
				retries = append(retries, cl.m)
			case DeadLetter:
				dead++
				t.Errorf("message dead-lettered: %s after %d attempts", d.Reason, cl.m.attempt)
			}
		}
		calls = kept
		// Re-attempts that are due, each with a token.
		waiting := retries[:0]
		for _, m := range retries {
			if now.Before(m.due) || !lim.TryAcquire() {
				waiting = append(waiting, m)
				continue
			}
			if !tryWithdraw(b) {
				lim.Release(0)
				waiting = append(waiting, m)
				continue
			}
			m.attempt++
			count(&again, now)
			calls = append(calls, call{m, now.Add(latency)})
		}
		retries = waiting
		// Fresh messages, unless intake is paused (then one probe a second).
		for len(backlog) > 0 {
			if intake.Paused() {
				if now.Before(nextProbe) {
					break
				}
				nextProbe = now.Add(time.Second)
			}
			if !lim.TryAcquire() {
				break
			}
			m := backlog[0]
			backlog = backlog[1:]
			m.attempt, m.first = 1, now
			b.Deposit()
			count(&fresh, now)
			calls = append(calls, call{m, now.Add(latency)})
			if intake.Paused() {
				break // the probe
			}
		}
		c.advance(step)
	}

	secs := outage.Seconds()
	t.Logf("outage: %d first attempts, %d re-attempts; minute after: %d first attempts, %d re-attempts; %d handled, %d dead-lettered, drained after %v",
		fresh[0], again[0], fresh[1], again[1], done, dead, c.now().Sub(start).Round(time.Second))
	if limit := ratio*float64(fresh[0]) + floor*secs + concurrency; float64(again[0]) > limit {
		t.Errorf("re-attempts during the outage = %d, more than ratio × first attempts + floor × 60s + concurrency = %.0f", again[0], limit)
	}
	if limit := (1+ratio)*float64(fresh[1]) + floor*secs + concurrency; float64(fresh[1]+again[1]) > limit {
		t.Errorf("calls in the minute after recovery = %d, more than (1 + ratio) × first attempts + floor × 60s + concurrency = %.0f",
			fresh[1]+again[1], limit)
	}
	if fresh[0] >= rate*int(secs) {
		t.Errorf("intake never paused: %d first attempts during the outage (all %d arrivals)", fresh[0], rate*int(secs))
	}
	if done != messages || dead != 0 {
		t.Errorf("%d handled, %d dead-lettered; want all %d handled", done, dead, messages)
	}
}
