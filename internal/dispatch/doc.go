// Package dispatch is the engine: it takes deliveries from each source, calls
// the app, asks the budget for a decision, transfers retry and dead-letter
// copies, and settles the source only after the copy is confirmed.
//
// A delivery's walk runs on a pooled goroutine from its arrival to its
// answer. A success then goes to the journal with the rest of its walk (the
// ack, the end of the walk) as a callback the commit runs, so that no
// goroutine is parked per record waiting on the disk; a retry or
// dead-letter copy is published and confirmed by the walk itself.
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
