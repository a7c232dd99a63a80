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
	if tg.Transport == handler.TransportGRPC {
		return handler.NewGRPC(handler.GRPCOptions{URL: h.URL, Classifier: classifier})
	}
	return handler.NewHTTP(handler.HTTPOptions{URL: h.URL, MaxConcurrency: h.MaxConcurrency, Classifier: classifier})
}
