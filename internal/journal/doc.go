// Package journal is the hand-off journal: every state change of a hand-off
// is a record in a bbolt file, so that after a crash the sidecar knows, for
// each redelivered message, whether the app already handled it and whether a
// retry or dead-letter copy was already confirmed — and an operator can read
// the whole story of any event.
//
// A hand-off is keyed by (source, event id, replay id). Its records form a
// timeline:
//
//	RECEIVED(hop) → ATTEMPT n → OUTCOME n → TRANSFERRING(hop+1, dest) → TRANSFERRED → SETTLED
//	                                   └─ (success or drop) ───────────────────────→ SETTLED
//
// A hop is one delivery of the message: the original (hop 0) and each copy
// the sidecar made (hop 1, 2, …, carried in the copy's handoff-hops header).
//
// Each hand-off gets an id when its first record is written, in that order,
// and its records are stored under the id: the records of the messages in
// flight all land at the end of the tree, so a commit writes a few pages
// however random the event ids are. One index maps each key to its id; it
// would be the only write to a random place, once per hand-off, so a new
// key's entry waits in memory and is merged into the index later, thousands
// at a time in key order (recent.go): a page of the index is rewritten once
// for all the keys that land on it. The keys not yet merged are read back
// from their hand-offs' first records when the journal opens. A journal of
// the earlier layout (records under the key itself) is upgraded when it
// opens.
//
// Writes are group-committed: one goroutine batches records from every caller
// into one bbolt transaction (one fsync), and Append returns once the batch
// holding its records is durable. AppendAsync queues records without waiting.
//
// Settled hand-offs are kept for Options.Retention, and the file's live data
// (its pages in use, free pages not counted) within Options.MaxSize: past
// it, the earliest settled hand-offs are dropped down to 90% of it. Open
// hand-offs are never dropped for size; they are what a restart needs.
//
// The journal also names the sidecar that writes it: an instance id made at
// random when the file is first opened and kept in it (InstanceID), also
// across Repair and Reset. A restart on the same file is the same instance;
// two running sidecars cannot share a file, so they never share an id. The
// Kafka adapter's static group membership and transactional ids are built on
// it.
//
// # Caveats
//
// With Sync set to None the file is not fsynced: a machine crash (not a
// process crash) can lose the last records. A record lost that way costs a
// duplicate, never a message: the broker still holds every unacked message.
//
// The journal is local to one sidecar. It narrows duplicates and explains
// them; it does not replace idempotent handlers.
//
// MaxSize bounds the live data, not the file: bbolt reuses freed pages
// before it grows the file, so the file stops growing, but it never
// shrinks, and it is grown in steps (16 MiB) past the pages in use. A read
// transaction held open (a long Scan) keeps the pages freed meanwhile from
// reuse, and the file grows while it lasts. Open hand-offs alone may fill
// MaxSize: they are kept, the file grows past it, and an Error says so.
package journal
