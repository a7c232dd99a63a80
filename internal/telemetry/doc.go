// Package telemetry serves the sidecar's operational endpoints: /metrics,
// and the health endpoints, one question each (see Server): /healthz (the
// process answers), /startupz (it serves, /drain with it), /runningz (it is
// not stopping) and /readyz (every broker connection is up, the app is
// reachable, the journal has room).
package telemetry
