// Package dispatch is the engine: it takes deliveries from each source, calls
// the app, asks the budget for a decision, transfers retry and dead-letter
// copies, and settles the source only after the copy is confirmed.
//
// It owns the small interfaces it needs (Source, Transferer, Deliverer) and
// never imports a concrete broker; cmd/sidecar wires adapters into Routes.
//
// # Caveats
//
// When the app is unreachable (nothing accepts the connection) the engine
// holds: intake stops, deliveries in hand stay unsettled, and a prober dials
// the app with backoff. No attempt is burned while holding.
//
// A transfer that fails (the broker is away, the destination queue is gone)
// is retried with backoff while the source delivery stays unsettled; it is
// never acked on a failed transfer.
//
// A message's handoff-* headers are read only on copies the sidecar made
// itself (retry copies), with one exception: a replayed dead letter, which
// comes back on its source, is known by the event id, replay id and dead
// letter (handoff-replay-of) it was republished with. Its attempts and
// deadline start fresh.
package dispatch
