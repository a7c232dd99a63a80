// Package handler delivers a message to the app and classifies its answer.
//
// HTTP delivery uses CloudEvents binary content mode: the body is the message
// body, the event's attributes are ce-* headers, and the sidecar adds
// Handoff-Attempt, Handoff-Deadline and Handoff-Redelivered. gRPC delivery
// calls handoff.handler.v1.MessageHandler with the same attributes and
// attempt fields in the request (and the attempt fields and trace context as
// metadata). ParseURL says which from handler.url. The answer — a status
// code, optionally refined by the Handoff-Outcome and Retry-After response
// headers, or a gRPC outcome enum or status — becomes a budget.Outcome in one
// place, Classifier.
//
// # Caveats
//
// A call the app never received (connection refused, nothing listening) is
// Unreachable, not a failure: it must not burn an attempt. Any error after the
// request may have reached the app is Unknown, because its effect may have
// happened. Over gRPC both show as UNAVAILABLE; the client tells them apart
// by whether the call left on a connection and whether a gRPC answer came
// back (grpc.go, reachStats), never by the code alone.
//
// In batch mode a request that fails as a whole (a server error, a timeout, a
// rejection) is sent again in halves until the failing message stands alone,
// so one poison message does not cost its batch-mates attempts. The halves
// resend events the app may have seen already: a batch handler must be as
// idempotent as a single one. Batcher does this for every transport through
// BatchSender.
package handler
