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
// SETTLED follows the ack, except for an answer the ack follows at once
// (dispatch's common path): there it is written with the OUTCOME, ahead of
// the ack, so that a first-attempt success is one part. Nothing depends on
// it as proof of the ack; a crash between that commit and the ack leaves a
// redelivery that the handled OUTCOME settles.
//
// A hop is one delivery of the message: the original (hop 0) and each copy
// the sidecar made (hop 1, 2, …, carried in the copy's handoff-hops header).
//
// The file is an append-only log (part.go): each group commit appends
// values, a quarter page each, under an increasing sequence number; a value
// holds each hand-off's records of that commit as one part (the requests of
// one hand-off in a batch are joined, writer.go), which names its
// hand-off in full the first time and by a key check after that, and links
// to the previous part of the same event (in any replay). So a commit
// writes at the end of one tree however random the event ids are, and the
// oldest history is dropped a range of sequence numbers at a time.
//
// Where an event's newest part is lives in memory (index.go): a map for the
// parts since the latest seal, and sealed segments of sealAt events kept in
// the file with a blocked Bloom filter in memory, bit-sliced 32 segments
// to a filter (filter.go). An event the journal has
// never seen costs a look in memory and no read of the file. The open set
// (events with a hand-off received and not settled) is kept in memory and
// written with each seal; Open rebuilds the index from the segments'
// filters, the newest segment's open set and the log written after it. A
// journal of an earlier layout is rewritten into this one when it opens
// for writing, beside itself, and the old file kept as <path>.format<N>.
//
// Writes are group-committed: one goroutine batches records from every caller
// into one bbolt transaction (one fsync), and Append returns once the batch
// holding its records is durable. AppendThen is Append without the wait: its
// callback runs once the batch is durable, after the commit, in commit order,
// on a goroutine of the journal's own (the engine hands a success's ack to
// it). AppendAsync queues records nobody waits for; they wait up to
// Options.AsyncDelay for a commit that somebody waits on.
//
// The log's oldest values are dropped once their newest record is older
// than Options.Retention, and while the file's live data (its pages in use,
// free pages not counted) is over Options.MaxSize, down to 90% of it. An
// open hand-off with a part in a dropped range is written again whole at
// the log's end first: open hand-offs are never dropped for size, and for
// age only once their latest record is older than Retention.
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
// A look-up of an event the tail does not hold tests every segment's
// filter, one cache line each: at the default MaxSize, some thirty of
// them. Segments are not merged yet.
//
// A part that fails its checksum is counted at Open (Recovery.Unreadable)
// and its hand-off's state is an error; dispatch handles such a message as
// new, at worst a duplicate call.
//
// MaxSize bounds the live data, not the file: bbolt reuses freed pages
// before it grows the file, so the file stops growing, but it never
// shrinks, and it is grown in steps (16 MiB) past the pages in use. A read
// transaction held open (a long Scan) keeps the pages freed meanwhile from
// reuse, and the file grows while it lasts. Open hand-offs alone may fill
// MaxSize: they are kept, the file grows past it, and an Error says so.
package journal
