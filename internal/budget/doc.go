// Package budget decides what happens to a message after each answer from the
// app: ack, delayed retry (which tier, due when), dead-letter (why), or hold;
// and how much load failures may add: the shared retry budget (RetryBudget),
// the adaptive concurrency limit (Limiter) and when fresh intake pauses
// (Intake).
//
// Decisions are pure functions of their inputs and a clock reading; the
// randomness of full-jitter backoff is injected, and the budget reads time
// only through its clock, so tests are deterministic and never sleep. The
// package imports nothing else of the sidecar's.
//
// # Caveats
//
// A retry is only ever scheduled on one of the configured delay tiers. The
// tier chosen is the smallest one at least as long as the computed delay; when
// the delay is longer than the largest tier the copy comes back early and is
// re-delayed (without an attempt) until it is due — see Redelay.
package budget
