// Package config is the sidecar's YAML schema: the Config struct, its
// defaults, strict loading and Validate.
//
// Loading is strict: an unknown key, a value of the wrong type or a bad
// duration is an error that names its YAML path (for example
// "sources[1].rabbitmq.prefetch"). Validate reports every problem at once, not
// the first, so an operator fixes a file in one pass.
//
// # Caveats
//
// Durations are Go duration strings ("250ms", "1m30s"); a bare number is an
// error rather than a guess at its unit.
package config
