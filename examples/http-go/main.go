// Command http-go is a Handoff handler written with net/http only: the
// sidecar POSTs each order to /events in CloudEvents binary mode, and the
// status code of the answer says what becomes of it.
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// order is the message body the demo producer sends.
type order struct{ ID, Kind string }

// shop is the order service. done holds the ce-id of every event handled:
// the sidecar narrows duplicates, but a producer's resend or a redelivery
// after a lost answer still reaches the app, which must not do the work
// twice. A real service keeps this in its database, written in the same
// transaction as the work; here mu stands for that transaction.
type shop struct {
	mu   sync.Mutex
	done map[string]bool
}

func (s *shop) events(w http.ResponseWriter, r *http.Request) {
	// Binary mode: the event's attributes are ce-* headers and its data is
	// the body. A CloudEvents SDK (github.com/cloudevents/sdk-go/v2,
	// cloudevents.NewEventFromHTTPRequest) would read them into an event,
	// and a router (chi, gin) would stand where http.HandleFunc does; neither
	// is needed to honour the contract.
	id := r.Header.Get("ce-id")
	attempt, _ := strconv.Atoi(r.Header.Get("Handoff-Attempt"))
	deadline, _ := time.Parse(time.RFC3339, r.Header.Get("Handoff-Deadline"))
	if r.Header.Get("Handoff-Redelivered") == "true" {
		// A previous attempt may have done the work and lost its answer.
		log.Printf("redelivered event %s (attempt %d): it may have been handled already", id, attempt)
	}
	var o order
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
		// Permanent: dead-lettered at once, with the body as evidence.
		http.Error(w, "not an order: "+err.Error(), http.StatusUnprocessableEntity)
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.done[id]:
		// Handled before: answer 2xx again, without doing it again.
		log.Printf("duplicate %s (event %s): already handled, answering 200 again", o.ID, id)
	case o.Kind == "bad":
		// Permanent: no retry can help; the body is the reason the
		// dead letter keeps.
		log.Printf("rejected %s: unknown product", o.ID)
		http.Error(w, "unknown product", http.StatusUnprocessableEntity)
	case o.Kind == "flaky" && attempt == 1:
		// Transient: a dependency is down; the sidecar retries after
		// Retry-After (a 5xx without it backs off on its own).
		log.Printf("busy %s (attempt %d): 503, Retry-After 1", o.ID, attempt)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "stock service busy", http.StatusServiceUnavailable)
	case o.Kind == "early" && attempt == 1:
		// A precondition not met yet: 409 (or any status with
		// Handoff-Outcome: defer) tries again later without counting a
		// failed attempt. A real service would look the payment up.
		log.Printf("deferred %s (attempt %d): payment not confirmed yet", o.ID, attempt)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "payment not confirmed yet", http.StatusConflict)
	default:
		// Handoff-Deadline is when the sidecar stops trying: close to it,
		// do only what must be done, so the answer is back in time.
		left := time.Until(deadline).Round(time.Second)
		email := left > 30*time.Second
		s.done[id] = true
		log.Printf("handled %s (event %s, attempt %d, deadline in %s, email sent %v)", o.ID, id, attempt, left, email)
		w.WriteHeader(http.StatusOK)
	}
}

func main() {
	addr := flag.String("listen", "127.0.0.1:8080", "address to serve POST /events on")
	flag.Parse()
	s := &shop{done: map[string]bool{}}
	http.HandleFunc("POST /events", s.events)
	log.Printf("order service listening on http://%s/events", *addr)
	log.Fatal(http.ListenAndServe(*addr, nil))
}
