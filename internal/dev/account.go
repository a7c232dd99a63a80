package dev

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// account prints the live account and keeps the totals.
type account struct {
	mu       sync.Mutex
	out      io.Writer
	start    time.Time
	state    map[string]string // id → ok, dead
	calls    int
	produced int
	demo     bool // the demo app answers, and counts the calls
	// again is how far the resend of the first order has got (an app of
	// the user's own only); againID is that order's id.
	again   againState
	againID string
	retried map[string]bool // id/attempt of each retry copy reported
}

// againState is how far the resend of an order already handled has got.
type againState int

const (
	againNone    againState = iota // no resend: the demo app, or nothing to resend
	againWaiting                   // waiting for the first order to be settled
	againSent                      // published again, not yet settled again
)

// called records one call the demo app answered with ans, named by words.
func (a *account) called(id, attempt, words string, ans answer) {
	a.line("%s  attempt %s  → %s %s", id, attempt, words, ans.says)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	if ans.handled {
		a.state[id] = "ok"
	}
}

// handled records that an app of the user's own handled id.
func (a *account) handled(id string) {
	a.mu.Lock()
	again := a.again == againSent && id == a.againID
	a.mu.Unlock()
	if again {
		a.line("%s  resend answered 2xx by the app (its log says whether it did the work twice)", id)
	} else {
		a.line("%s  handled by the app", id)
	}
	a.settled(id, "ok")
}

// settled records id's fate: ok or dead.
func (a *account) settled(id, fate string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.again == againSent && id == a.againID {
		// The resend's own fate; the order's stays the first one's.
		a.again = againNone
		return
	}
	a.state[id] = fate
}

func (a *account) line(format string, args ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	fmt.Fprintf(a.out, "%6.2fs  "+format+"\n", append([]any{time.Since(a.start).Seconds()}, args...)...)
}

func (a *account) finished(messages int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.produced == messages && len(a.state) == messages && a.again == againNone
}

func (a *account) totals(messages int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ok, dead := 0, 0
	for _, s := range a.state {
		if s == "ok" {
			ok++
		} else {
			dead++
		}
	}
	fmt.Fprintf(a.out, "\nTotals: %d produced, %d handled, %d dead-lettered, %d still in flight", a.produced, ok, dead, a.produced-ok-dead)
	if a.demo {
		fmt.Fprintf(a.out, "; %d calls to the app", a.calls)
	}
	fmt.Fprintln(a.out, ".")
}

// retry reports the retry copy of id made after attempt, once: a copy
// delayed again (it needed a longer wait than its tier) is the same retry.
func (a *account) retry(id, attempt, class, why string) {
	a.mu.Lock()
	if a.retried == nil {
		a.retried = map[string]bool{}
	}
	seen := a.retried[id+"/"+attempt]
	a.retried[id+"/"+attempt] = true
	a.mu.Unlock()
	if seen {
		return
	}
	if class == "defer" {
		a.line("%s  attempt %s  → deferred: tried again later, not counted as a failure (%s)", id, attempt, why)
		return
	}
	a.line("%s  attempt %s  → %s: retried later (%s)", id, attempt, class, why)
}
