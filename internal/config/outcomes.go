package config

import (
	"fmt"

	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/handler"
	"handoff.dev/handoff/internal/journal"
)

// validateOutcomesGRPC checks outcomes.grpc, and that each outcomes map
// matches the handler's transport: an HTTP table does nothing for a gRPC
// app, and the operator should hear so rather than wonder.
func (c *Config) validateOutcomesGRPC(ps *Problems) {
	tg, err := handler.ParseURL(c.Handler.URL)
	if err == nil && tg.Transport == handler.TransportGRPC && len(c.Outcomes.HTTP) > 0 {
		ps.add("outcomes.http", "applies to HTTP handlers only, and handler.url is a gRPC one: map status codes with outcomes.grpc")
	}
	if err == nil && tg.Transport == handler.TransportHTTP && len(c.Outcomes.GRPC) > 0 {
		ps.add("outcomes.grpc", "applies to gRPC handlers only, and handler.url is an HTTP one: map statuses with outcomes.http")
	}
	for key, val := range c.Outcomes.GRPC {
		path := "outcomes.grpc." + key
		if _, ok := handler.ParseCode(key); !ok {
			ps.add(path, "want a gRPC status code name other than OK, such as UNAVAILABLE or NOT_FOUND")
		}
		if _, ok := budget.ParseOutcome(val); !ok {
			ps.add(path, "unknown outcome %q (want success, retry, overload, unknown, defer, permanent, dead-letter or drop)", val)
		}
	}
}

// Classifier is the classification of the app's answers these overrides
// make, for the handler's transport: what the sidecar runs with. A config
// that passed Validate always has one.
func (o Outcomes) Classifier() (*handler.Classifier, error) {
	c, err := handler.NewClassifier(o.HTTP)
	if err != nil {
		return nil, fmt.Errorf("outcomes.http: %w", err)
	}
	if c, err = c.WithGRPC(o.GRPC); err != nil {
		return nil, fmt.Errorf("outcomes.grpc: %w", err)
	}
	return c, nil
}

// SyncMode is journal.sync as the journal takes it.
func (j Journal) SyncMode() (journal.SyncMode, error) {
	m, ok := journal.ParseSyncMode(j.Sync)
	if !ok {
		return m, fmt.Errorf("journal.sync: want always, batch or none, got %q", j.Sync)
	}
	return m, nil
}
