package sidecar

import (
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/handler"
)

// appClient calls the app over the transport its URL names. Batch delivery
// wraps it (handler.Batcher), whichever it is.
type appClient interface {
	dispatch.Deliverer
	handler.BatchSender
	Close()
}

// newAppClient builds the client for handler.url: HTTP for http://,
// https:// and http+unix://, gRPC for grpc://, grpcs:// and grpc+unix://.
func newAppClient(h config.Handler, classifier *handler.Classifier) (appClient, error) {
	tg, err := handler.ParseURL(h.URL)
	if err != nil {
		return nil, configError(err)
	}
	// Each constructor's nil is returned as a nil interface, so that a
	// failed Build does not close a client it never made.
	if tg.Transport == handler.TransportGRPC {
		c, err := handler.NewGRPC(handler.GRPCOptions{URL: h.URL, Classifier: classifier})
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	c, err := handler.NewHTTP(handler.HTTPOptions{URL: h.URL, MaxConcurrency: h.MaxConcurrency, Classifier: classifier})
	if err != nil {
		return nil, err
	}
	return c, nil
}
