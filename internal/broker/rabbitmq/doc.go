// Package rabbitmq is the RabbitMQ adapter: it consumes a source queue and its
// retry work queue with manual acks, publishes retry and dead-letter copies
// with publisher confirms, declares the derived topology, and reconnects.
//
// For a source queue Q the topology is:
//
//	Q                 the source, used as it is (checked passively, never redeclared)
//	Q.retry.<tier>    one quorum queue per delay tier, with a per-queue x-message-ttl,
//	                  dead-lettering (at-least-once) into Q.retry
//	Q.retry           the retry work queue, consumed like Q
//	Q.dlq             the dead-letter stream (x-queue-type: stream), kept for
//	                  Options.DeadLetterRetention (x-max-age)
//
// Copies are published to the default exchange with mandatory set. A publish
// counts as transferred only when the broker acks it and did not return it.
//
// The dead-letter stream is a log: ReadStream reads it from any offset or
// time, and FindCopy reads it back from about the time of an unconfirmed
// publish. A Q.dlq an earlier version declared as a quorum queue is moved
// into the stream when the client connects (migrate.go), through the stream
// Q.dlq.migrating, with every step resumable after a crash.
//
// # Caveats
//
// amqp091-go does not recover connections by itself here: Client.Run redials
// with backoff after any connection or channel loss and redeclares the
// topology. A delivery belongs to its channel; once that channel is gone the
// broker has requeued the delivery, its Ack fails and its Lost channel is
// closed.
//
// Acks are coalesced per consumer channel (acker): one basic.ack with
// multiple set covers the settled prefix of delivery tags, never a delivery
// still in flight or handed back; an ack held behind a slow delivery goes out
// on its own after 10ms, or sooner when a quarter of the prefetch is held.
//
// Per-message TTL (the expiration property) only expires messages at the head
// of a queue, which is why each delay has its own queue; copies never carry the
// original's expiration.
//
// RabbitMQ 3.10 keeps a stream message in AMQP 1.0 form: a header whose value
// is a table or an array would be dropped, and a decimal one closes the
// connection with an internal error, so dead-letter copies carry such values
// as text (streamHeaders). A stream refuses basic.get (540, which closes the
// connection) and needs a prefetch to be consumed. Its x-max-age removes only
// whole segments, when a new one starts, hence the 16 MiB segments. AMQP
// 0.9.1 does not say where a stream ends: see ReadStream.
package rabbitmq
