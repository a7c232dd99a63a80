package config

import (
	"strings"
	"testing"
)

func TestHandlerURLForms(t *testing.T) {
	tests := []struct {
		name    string
		url     string
		grpc    map[string]string
		wantErr string // a problem line's start; empty: valid
	}{
		{name: "http", url: "http://127.0.0.1:8080/events"},
		{name: "https", url: "https://app.internal/events"},
		{name: "http over a unix socket", url: "http+unix:///run/app/app.sock"},
		{name: "http over a unix socket with a path", url: "http+unix:///run/app/app.sock:/events"},
		{name: "grpc", url: "grpc://127.0.0.1:9000"},
		{name: "grpcs", url: "grpcs://app.internal:443"},
		{name: "grpc over a unix socket", url: "grpc+unix:///run/app/app.sock"},
		{name: "grpc overrides", url: "grpc://127.0.0.1:9000", grpc: map[string]string{"NOT_FOUND": "retry", "aborted": "permanent"}},
		{name: "bare unix", url: "unix:///run/app.sock", wantErr: "handler.url: unix:// does not say the protocol"},
		{name: "grpc without port", url: "grpc://app", wantErr: "handler.url: no port in"},
		{name: "grpc with a path", url: "grpc://app:9000/Handle", wantErr: "handler.url: a gRPC handler URL names host:port only"},
		{name: "grpc with a password", url: "grpc://u:secret@app:9000", wantErr: "handler.url: a gRPC handler URL carries no user"},
		{name: "relative socket", url: "grpc+unix://run/app.sock", wantErr: "handler.url: grpc+unix://run...: the socket's path starts after the third slash"},
		{name: "unknown scheme", url: "ftp://x/", wantErr: `handler.url: scheme "ftp" not supported`},
		{name: "grpc overrides on http", url: "http://127.0.0.1:8080/", grpc: map[string]string{"NOT_FOUND": "retry"}, wantErr: "outcomes.grpc: applies to gRPC handlers only"},
		{name: "unknown code", url: "grpc://127.0.0.1:9000", grpc: map[string]string{"NOPE": "retry"}, wantErr: "outcomes.grpc.NOPE: want a gRPC status code name"},
		{name: "OK overridden", url: "grpc://127.0.0.1:9000", grpc: map[string]string{"OK": "retry"}, wantErr: "outcomes.grpc.OK: want a gRPC status code name other than OK"},
		{name: "bad outcome", url: "grpc://127.0.0.1:9000", grpc: map[string]string{"ABORTED": "later"}, wantErr: `outcomes.grpc.ABORTED: unknown outcome "later"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Default()
			cfg.Handler.URL = tt.url
			cfg.Outcomes.GRPC = tt.grpc
			cfg.Sources = []Source{{Name: "s", RabbitMQ: &RabbitMQ{URL: "amqp://localhost/", Queue: "q", Prefetch: 100}}}
			cfg.applySourceDefaults()
			err := cfg.Validate()
			var msg string
			if err != nil {
				msg = err.Error()
			}
			if strings.Contains(msg, "secret") {
				t.Errorf("a problem quotes the password: %s", msg)
			}
			if tt.wantErr == "" {
				if strings.Contains(msg, "handler.url") || strings.Contains(msg, "outcomes.") {
					t.Errorf("%s: %s", tt.url, msg)
				}
				return
			}
			found := false
			for _, line := range strings.Split(msg, "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), tt.wantErr) {
					found = true
				}
			}
			if !found {
				t.Errorf("no problem starting %q in:\n%s", tt.wantErr, msg)
			}
		})
	}
}
