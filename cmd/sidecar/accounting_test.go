package main

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// ledgerApp is an app for a mixedWorkload: poison-* is rejected (422),
// flaky-* fails its first call (500), the rest succeed; each call takes work.
// It accounts for every call: a call for an id that had already succeeded
// is a repeat, and a repeat must say Handoff-Redelivered: true.
type ledgerApp struct {
	*app
	mu        sync.Mutex
	succeeded map[string]int
	repeats   int // calls after the id's first success
	unflagged int // repeats that did not say Handoff-Redelivered: true
	held      chan struct{}
}

func newLedgerApp(t *testing.T, work time.Duration) *ledgerApp {
	l := &ledgerApp{succeeded: map[string]int{}}
	l.app = newApp(t, func(w http.ResponseWriter, c call, prior []call) {
		time.Sleep(work) // the app's own work
		l.mu.Lock()
		held := l.held
		l.mu.Unlock()
		if held != nil {
			<-held
		}
		id := c.Header.Get("Ce-Id")
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.succeeded[id] > 0 {
			l.repeats++
			if c.Header.Get("Handoff-Redelivered") != "true" {
				l.unflagged++
			}
		}
		switch {
		case strings.HasPrefix(id, "poison-"):
			w.WriteHeader(http.StatusUnprocessableEntity)
		case strings.HasPrefix(id, "flaky-") && len(prior) == 0:
			w.WriteHeader(http.StatusInternalServerError)
		default:
			l.succeeded[id]++
			w.WriteHeader(http.StatusOK)
		}
	})
	return l
}

// hold keeps every call from answering until release is called: the
// sidecar then has its calls and deliveries in flight.
func (l *ledgerApp) hold() (release func()) {
	ch := make(chan struct{})
	l.mu.Lock()
	l.held = ch
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.held = nil
		l.mu.Unlock()
		close(ch)
	}
}

// handled is how many ids have succeeded.
func (l *ledgerApp) handled() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.succeeded)
}

// account checks every id ended handled or (poison only) dead-lettered
// once, that every repeat was flagged and that there were at most
// maxRepeats, and logs the row RELIABILITY.md carries.
func (l *ledgerApp) account(t *testing.T, what string, ids []string, dead map[string]int, maxRepeats int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	lost, wrongDead, dupDead, deadLettered := 0, 0, 0, 0
	for _, id := range ids {
		poison := strings.HasPrefix(id, "poison-")
		switch {
		case poison && dead[id] == 0, !poison && l.succeeded[id] == 0:
			lost++
			if lost <= 10 {
				t.Errorf("lost: %s (handled %d, dead-lettered %d)", id, l.succeeded[id], dead[id])
			}
		case !poison && dead[id] > 0:
			wrongDead++
			t.Errorf("good message %s dead-lettered", id)
		}
		if dead[id] > 1 {
			dupDead += dead[id] - 1
		}
		if dead[id] > 0 {
			deadLettered++
		}
	}
	t.Logf("%s: %d messages, %d app calls: lost %d, repeated %d (flagged %d), dead-lettered %d (duplicate copies %d), handled %d",
		what, len(ids), len(l.allCalls()), lost, l.repeats, l.repeats-l.unflagged, deadLettered, dupDead, len(l.succeeded))
	if lost != 0 {
		t.Errorf("%d messages lost", lost)
	}
	if l.unflagged != 0 {
		t.Errorf("%d of %d repeated calls did not say Handoff-Redelivered: true", l.unflagged, l.repeats)
	}
	if l.repeats > maxRepeats {
		t.Errorf("%d repeated calls, more than the %d that could have been in flight", l.repeats, maxRepeats)
	}
	if dupDead != 0 {
		t.Errorf("%d duplicate dead-letter copies", dupDead)
	}
}

// idsOf counts the ids a reader found, by what key returns for each.
func idsOf[T any](items []T, key func(T) string) map[string]int {
	m := map[string]int{}
	for _, it := range items {
		m[key(it)]++
	}
	return m
}
