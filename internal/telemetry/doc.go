// Package telemetry serves the sidecar's operational endpoints. For now that is
// /healthz (the process is up) and /readyz (every broker connection is up and
// the app is reachable); metrics and traces join it later.
package telemetry
