// Package broker holds what every broker adapter shares: the Message and
// Delivery types a source yields, the handoff-* headers a copy carries from
// hop to hop (Trail), and the names of the derived retry and dead-letter
// destinations.
//
// Adapters (internal/broker/rabbitmq, later internal/broker/kafka) import this
// package and nothing of the engine's; the engine (internal/dispatch) owns the
// interfaces it needs from them.
package broker
