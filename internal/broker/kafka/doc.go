// Package kafka is the Kafka adapter, on franz-go: a group consumer of the
// source topic and its retry topics with manual commits at the contiguous
// watermark of settled records, retry topics paused until their head record
// is due, and retry and dead-letter copies produced with acks=all.
//
// For a source topic T consumed by group G the topology is:
//
//	T                     the source, used as it is
//	T.G.retry.<tier>      one topic per delay tier; its records are consumed by G
//	                      once due (the partition is paused until then)
//	T.G.dlq               the dead-letter topic
//
// # Caveats
//
// An offset is committed only when every record before it in its partition is
// settled (handled, or its copy acknowledged): a later success never commits
// past an earlier record still in flight or handed back. A record handed back
// at shutdown therefore holds its partition's commit where it is, and it and
// every record after it are consumed again by whoever owns the partition next.
//
// A retry partition is paused at its first record that is not yet due and its
// fetch position set back to its commit watermark: franz-go's SetOffsets also
// sets what the next commit of marks sends, so setting it to the record not
// due would commit past the records before it that are still in flight.
//
// With an instance id (Options.InstanceID) the member is static: a member that
// crashed and comes back under the same id takes its partitions back at once.
// Closing a static member's franz-go client does not leave the group, so Close
// removes it by its instance id (KIP-345) and its partitions move at once.
//
// With a transactional id (Options.TransactionalID) every commit is a
// transaction of a franz-go GroupTransactSession, run by one committer
// goroutine: copies commit together with the offsets their records settle.
// The session rewinds consumption to the last commit after an aborted
// transaction; records already handed out are not handed out again. A revoke
// abandons the partition's records in flight at once, without waiting or
// committing: the session holds the lock that ending a transaction needs
// while the revoke runs.
package kafka
