package budget

import (
	"math/rand"
	"testing"
	"time"
)

// storm is a simulated outage: the app is down (every call answers
// overload) for the first Outage, then it handles Workers calls at a time,
// each taking Latency, and answers overload within Reject to a call that
// finds them all busy, as a fragile app does: its capacity is
// μ = Workers/Latency. Preload messages wait in the broker at the start and
// more arrive at Lambda a second, Messages in all.
type storm struct {
	name                    string
	messages, preload       int
	lambda                  int // fresh messages a second
	ratio, floor            float64
	window                  time.Duration
	concurrency             int // the sidecar's max
	workers                 int // the app's
	latency, reject, outage time.Duration
	tiers                   []time.Duration
	// within, when set, bounds the drain instead of 1.5 × B/(μ−λ): for a
	// backlog so small that finding out the app is back (a probe, a token)
	// takes longer than draining it.
	within time.Duration
}

func (s storm) mu() int { return s.workers * int(time.Second/s.latency) }

// stormResult is what a simulation measured.
type stormResult struct {
	backlog int           // messages arrived and not done when the app came back
	drained time.Duration // from then until every one of them was done
	want    time.Duration // B/(μ−λ)
}

// TestRetryStormSimulation plays, on a manual clock, the storm of seed 001
// §2 and the recovery after it. The sidecar's parts are the real ones —
// RetryBudget, Limiter, Intake, Policy.Decide — wired as the engine wires
// them (see simulate).
//
// It checks the two promises of DESIGN §5: failed re-attempts in any window
// stay within ratio × first attempts + floor × window (+ one concurrency
// window in flight), so failures never multiply load; and once the app is
// back, the backlog B drains within 1.5 × B/(μ−λ) (seed 000), at the app's
// pace rather than the floor's. Nothing is lost or dead-lettered.
func TestRetryStormSimulation(t *testing.T) {
	for _, s := range []storm{
		{name: "10k messages, 60s outage", messages: 10000, preload: 1000, lambda: 100,
			ratio: 0.2, floor: 10, window: 10 * time.Second, concurrency: 64,
			workers: 8, latency: 20 * time.Millisecond, reject: time.Millisecond, outage: 60 * time.Second,
			tiers: []time.Duration{time.Second, 10 * time.Second, time.Minute}},
		// A queue filled before the outage: much of it fails once before
		// intake pauses and waits in the retry tiers, more than fresh
		// deposits after it could pay for; draining it takes less time
		// than finding out that the app is back.
		smallBacklog(),
	} {
		t.Run(s.name, func(t *testing.T) {
			r := simulate(t, s, true)
			if s.within > 0 {
				if r.drained > s.within {
					t.Errorf("the backlog of %d drained in %v, more than %v", r.backlog, r.drained, s.within)
				}
				return
			}
			if r.drained > r.want*3/2 {
				t.Errorf("the backlog of %d drained in %v, more than 1.5 × B/(μ−λ) = %v", r.backlog, r.drained, r.want*3/2)
			}
		})
	}
}

// smallBacklog is the recovery scenario the RabbitMQ test plays for real:
// 1,000 messages, concurrency 16, ratio 0.2 and a floor of 5, 8 s down.
func smallBacklog() storm {
	return storm{name: "1k backlog, 8s outage", messages: 1000, preload: 1000,
		ratio: 0.2, floor: 5, window: 10 * time.Second, concurrency: 16,
		workers: 16, latency: 5 * time.Millisecond, reject: time.Millisecond, outage: 8 * time.Second,
		tiers: []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second}, within: 5 * time.Second}
}

// Without refunds — every re-attempt spending its token for good, as the
// budget once did — the same small backlog drains at the floor's pace once
// fresh deposits run out: the starvation refunds exist to end.
func TestRetryStormWithoutRefundsFollowsTheFloor(t *testing.T) {
	s := smallBacklog()
	r := simulate(t, s, false)
	if r.drained < 2*s.within {
		t.Errorf("without refunds the backlog of %d drained in %v, within 2 × %v: the scenario no longer tells refunds apart",
			r.backlog, r.drained, s.within)
	}
}

// simulate plays s in steps of a millisecond: a first attempt deposits, a
// re-attempt waits for a token and, when refund is set, gives it back when
// it succeeds; a retry copy comes back after its delay tier; a failing first
// attempt with the budget spent pauses fresh intake (probes back off from
// 1 s to 10 s, any success resumes it); the limiter adapts to the answers.
// It fails t when a window's failed re-attempts pass the budget's bound or a
// message is dead-lettered.
func simulate(t *testing.T, s storm, refund bool) stormResult {
	t.Helper()
	const step = time.Millisecond
	var (
		messages    = s.messages
		preload     = s.preload
		lambda      = s.lambda
		ratio       = s.ratio
		floor       = s.floor
		window      = s.window
		concurrency = s.concurrency
		workers     = s.workers
		latency     = s.latency
		reject      = s.reject
		mu          = s.mu()
		outage      = s.outage
	)
	c := newClock()
	start := c.now()
	rng := rand.New(rand.NewSource(1))
	pol := &Policy{MaxAttempts: 1000, Base: 100 * time.Millisecond, Cap: 2 * time.Second,
		Tiers:    s.tiers,
		Deadline: time.Hour, DeferMaxAge: 24 * time.Hour, MinAttempt: 100 * time.Millisecond, Jitter: rng.Float64}
	b := NewRetryBudget(ratio, floor, window, c.now)
	lim := NewLimiter(concurrency)
	intake := NewIntake(concurrency)

	type msg struct {
		attempt int
		first   time.Time
		back    time.Time // when its retry copy is back from its delay tier
		started time.Time // its current attempt
		tok     Token
		done    bool
	}
	type call struct {
		m   *msg
		end time.Time
		o   Outcome
	}
	var (
		all       []*msg
		backlog   []*msg // in the broker: produced, not taken
		retries   []*msg // copies in delay tiers and the retry queue
		calls     []call
		busy      int // the app's workers in use
		done      int
		dead      int
		nextProbe time.Time
		probeGap  = time.Second
		// per millisecond since start: first attempts made, and re-attempts
		// started that then failed
		firsts, failed []int
		recovered      = start.Add(outage)
		backlogAt      = -1 // messages arrived and not done when the app came back
		drainedAt      time.Time
		limitAt        []int                                                            // the concurrency limit at each second after recovery
		oldCount       = min(messages, preload+int(outage.Seconds()*float64(lambda))+1) // the messages that arrived during the outage
		oldest         int                                                              // the first of them not done
	)
	tick := func(now time.Time) int { return int(now.Sub(start) / step) }
	bump := func(s *[]int, i int) {
		for len(*s) <= i {
			*s = append(*s, 0)
		}
		(*s)[i]++
	}
	for now := c.now(); done+dead < messages; now = c.now() {
		if now.Sub(start) > 2*time.Hour {
			t.Fatalf("not drained after 2h: %d done, %d dead, %d in backlog, %d retries", done, dead, len(backlog), len(retries))
		}
		// Arrivals.
		for want := min(preload+int(now.Sub(start).Seconds()*float64(lambda))+1, messages); len(all) < want; {
			m := &msg{}
			all = append(all, m)
			backlog = append(backlog, m)
		}
		if backlogAt < 0 && !now.Before(recovered) {
			backlogAt = len(all) - done - dead
		}
		if !now.Before(recovered) && now.Sub(recovered)%time.Second == 0 {
			limitAt = append(limitAt, lim.Limit())
		}
		// Answers.
		kept := calls[:0]
		for _, cl := range calls {
			if now.Before(cl.end) {
				kept = append(kept, cl)
				continue
			}
			if cl.o == Success {
				busy--
			}
			m := cl.m
			lim.Release(cl.o)
			intake.Observe(cl.o, m.attempt == 1, b.Exhausted)
			if m.tok.Taken() {
				if cl.o == Success && refund {
					b.Refund(m.tok)
				} else {
					bump(&failed, tick(m.started))
				}
				m.tok = Token{}
			}
			d := pol.Decide(Input{Outcome: cl.o, Attempt: m.attempt, FirstAttemptAt: m.first,
				Deadline: m.first.Add(pol.Deadline), Now: now})
			switch d.Action {
			case Ack:
				done++
				m.done = true
			case Delay:
				m.back = now.Add(d.Tier)
				retries = append(retries, m)
			case DeadLetter:
				dead++
				t.Errorf("message dead-lettered: %s after %d attempts", d.Reason, m.attempt)
			}
		}
		calls = kept
		if !intake.Paused() {
			probeGap = time.Second
		}
		// The app's answer to a call starting now.
		answer := func() (Outcome, time.Time) {
			if now.Before(recovered) || busy >= workers {
				return Overload, now.Add(reject)
			}
			busy++
			return Success, now.Add(latency)
		}
		// Re-attempts that are back, each with a token (skipped whole when
		// none could start, which keeps the simulation quick).
		if lim.InFlight() < lim.Limit() && !b.Exhausted() {
			waiting := retries[:0]
			for i, m := range retries {
				if now.Before(m.back) || !lim.TryAcquire() {
					waiting = append(waiting, m)
					continue
				}
				tok, _, _ := b.Poll(true)
				if !tok.Taken() {
					lim.Release(0)
					waiting = append(waiting, retries[i:]...)
					break
				}
				m.tok, m.started = tok, now
				m.attempt++
				o, end := answer()
				calls = append(calls, call{m, end, o})
			}
			retries = waiting
		}
		// Fresh messages, unless intake is paused (then a probe now and then).
		for len(backlog) > 0 {
			if intake.Paused() {
				if now.Before(nextProbe) {
					break
				}
				nextProbe = now.Add(probeGap)
				probeGap = min(2*probeGap, 10*time.Second)
			}
			if !lim.TryAcquire() {
				break
			}
			m := backlog[0]
			backlog = backlog[1:]
			m.attempt, m.first = 1, now
			b.Deposit()
			bump(&firsts, tick(now))
			o, end := answer()
			calls = append(calls, call{m, end, o})
			if intake.Paused() {
				break // the probe
			}
		}
		if drainedAt.IsZero() && backlogAt >= 0 {
			for oldest < oldCount && all[oldest].done {
				oldest++
			}
			if oldest == oldCount {
				drainedAt = now
			}
		}
		c.advance(step)
	}

	// Failed re-attempts in every window of the budget's length that ends
	// with one, counted as the budget counts: in its buckets (window/20
	// each; the clock starts on a bucket's edge), against the first attempts
	// of the same buckets.
	per := int(window / budgetSlots / step)
	var sumF, sumR, worst int
	var worstBound float64
	for i := 0; i*per < max(len(firsts), len(failed)); i++ {
		for j := i * per; j < (i+1)*per; j++ {
			if j < len(firsts) {
				sumF += firsts[j]
			}
			if j < len(failed) {
				sumR += failed[j]
			}
		}
		if i >= budgetSlots {
			for j := (i - budgetSlots) * per; j < (i-budgetSlots+1)*per; j++ {
				if j < len(firsts) {
					sumF -= firsts[j]
				}
				if j < len(failed) {
					sumR -= failed[j]
				}
			}
		}
		last := 0 // failed re-attempts that started in this bucket
		for j := i * per; j < min((i+1)*per, len(failed)); j++ {
			last += failed[j]
		}
		if last == 0 {
			continue
		}
		bound := ratio*float64(sumF) + floor*window.Seconds() + float64(concurrency)
		if float64(sumR) > bound {
			t.Fatalf("%d failed re-attempts in the %v before %v, more than ratio × %d first attempts + floor × window + concurrency = %.0f",
				sumR, window, time.Duration((i+1)*per)*step, sumF, bound)
		}
		if sumR > worst {
			worst, worstBound = sumR, bound
		}
	}

	want := time.Duration(float64(backlogAt) / float64(mu-lambda) * float64(time.Second))
	took := drainedAt.Sub(recovered)
	if drainedAt.IsZero() {
		took = c.now().Sub(recovered)
	}
	t.Logf("backlog at recovery B = %d; μ = %d/s, λ = %d/s: B/(μ−λ) = %v; drained in %v; concurrency limit each second after recovery: %v",
		backlogAt, mu, lambda, want.Round(10*time.Millisecond), took.Round(10*time.Millisecond), limitAt[:min(len(limitAt), 30)])
	t.Logf("most failed re-attempts in one %v window: %d (bound there %.0f); %d handled, %d dead-lettered, all done after %v",
		window, worst, worstBound, done, dead, c.now().Sub(start).Round(time.Second))
	if done != messages || dead != 0 {
		t.Errorf("%d handled, %d dead-lettered; want all %d handled", done, dead, messages)
	}
	return stormResult{backlog: backlogAt, drained: took, want: want}
}
