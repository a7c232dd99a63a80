// Package deadletter keeps dead letters as owned business state (DESIGN §7):
// each has an identity, a state and a history, the same on every replica.
//
// # Two logs in the broker
//
// The DLQ is a log of the dead letters themselves: the RabbitMQ stream Q.dlq
// or the Kafka topic T.G.dlq, written by the sidecar's dead-letter moves. A
// dead letter's id is its position there (Q.dlq/<offset>,
// T.G.dlq/<partition>/<offset>, see ID); its entry carries the body, key,
// headers and the handoff-* evidence (event id, reason, last error and its
// class, attempts, origin, first failure) and nothing ever changes it.
//
// The ledger is a log of transitions beside it: the stream Q.dlq.ledger or
// the one-partition topic T.G.dlq.ledger, one partition so that it has one
// order. Each Record is one transition of one dead letter with who made it
// (the admin token's subject, or the replica that saw a replayed copy's
// outcome), when, why, and its payload (an approval's repaired body, a
// replay id, the new dead letter a failed replay became). Records are
// versioned JSON: a person can read them with the broker's own tools,
// there is no schema to generate, and a new field or a new kind of record
// (a replay run, its heartbeat) is added without breaking older readers,
// which skip a version or kind they do not know. Both logs keep the same
// retention (deadletter.retention): a record lives at least as long as the
// dead letter it names, and a repaired body, which may hold personal data as
// the original does, no longer.
//
// # States
//
// A dead letter is Pending when its DLQ entry is read. Decide is the one
// place that says which Transition is legal from which State; Apply decides
// on the index's latest view, appends the record, confirmed, and reads the
// ledger back. Every replica derives the states by replaying the ledger in
// its order through Decide: a record illegal in that order (two replicas
// decided at once; the later one lost) is refused by every reader alike, so
// all agree, and its writer gets ErrLost. Expired is never written: each
// replica derives it when the DLQ's first offset passes an open dead letter.
//
// # The index
//
// Each replica keeps an Index, a bbolt file of its own (the journal's path
// with ".deadletters" added), built from the two logs alone, so that it can
// be deleted at any time and is rebuilt from them. Its buckets: letters (id
// → Letter: evidence, state, history; not the body, which stays in the DLQ),
// open (source, dead-lettered-at, id: the oldest open first), counts
// (source, state → n) and offsets (log, partition → next offset to read),
// kept in step in each transaction. CatchUp reads the DLQ, then the ledger,
// from the stored offsets to their ends, in transactions of catchUpBatch
// messages that store the offsets with what they brought, then expires the
// open dead letters below the DLQ's first offset, logging and counting each.
// List, Get and Counts read the index alone.
//
// # Replays
//
// A Manager keeps the index caught up (every ManagerOptions.Poll) and
// answers the admin API: List, Get, Message, Counts, Apply (approve,
// terminate), and replay runs. A run is a record of kind "run" in the same
// ledger (RunRecord): created with its selection resolved to ids, held by
// the replica that created it, kept by heartbeats and taken over by another
// replica when they stop for longer than the run's TTL, ended or cancelled
// — every replica derives the same run from the ledger's order. Its runner
// publishes each selected letter's copy (the approval's repaired body, or
// the original) to the source with the same event id, the run's replay id
// and the letter's id (handoff-replay-of), and appends Replay once the
// broker confirmed the copy; it publishes the sample first and waits for
// its outcomes, stops when the failure ratio of known outcomes passes the
// run's threshold, and waits while Pressure says the app is pressed.
// Progress is read from the selected letters' histories, never stored.
//
// The replica whose engine handles a replayed copy records Complete before
// the copy's ack (Manager.Handled); a copy that fails again becomes a new
// dead letter naming the one it replays, and every reader derives the
// FailReplay from that entry, as it derives Expire from retention.
//
// # Caveats
//
// A ledger record that names a DLQ entry appended after the index's last
// DLQ read keeps its state on a letter that List leaves out until the entry
// is read. Apply tells its own record by a nonce after reading the ledger
// back; a read that ends early (a RabbitMQ stream read ends after a quiet
// spell, see rabbitmq.ReadStream) can make a record that was applied look
// lost: the next CatchUp shows the truth. A dead letter expired while
// Replaying stays Expired even if its replayed copy's outcome arrives later.
// A RabbitMQ stream gives an AMQP 0.9.1 reader no time of its own: a
// dead letter is dated by its copy's handoff-dead-lettered-at header, and
// one written by an older sidecar without it when an index first reads it.
// A runner that dies between a copy's confirm and its Replay record leaves
// a copy the ledger does not know; the replica taking the run over
// publishes that letter again (same event id and replay id).
package deadletter
