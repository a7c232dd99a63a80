// Package broker holds what every broker adapter shares: the Message and
// Delivery types a source yields, the handoff-* headers a copy carries from
// hop to hop (Trail), the CloudEvent a structured-mode message carries
// (Event, ParseStructured), and the names of the derived retry and
// dead-letter destinations.
//
// Adapters (internal/broker/rabbitmq, later internal/broker/kafka) import this
// package and nothing of the engine's; the engine (internal/dispatch) owns the
// interfaces it needs from them.
//
// # Caveats
//
// A structured-mode message has two readings: Body, the envelope as it came,
// which every copy carries unchanged, and Event, what the app gets. Code
// that hands a message to the app reads Message.Data, never Body.
package broker
