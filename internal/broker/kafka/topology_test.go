package kafka

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The dead-letter topic is created with deadletter.retention as its
// retention.ms; an existing one keeps its own, and the difference is logged.
func TestDeclareDeadLetterRetention(t *testing.T) {
	tests := []struct {
		name     string
		existing string // retention.ms of a dead-letter topic made beforehand; "" for none
		wantMs   string
		wantLog  bool
	}{
		{name: "created with the configured retention", wantMs: "1209600000"},
		{name: "existing with the same retention", existing: "1209600000", wantMs: "1209600000"},
		{name: "existing with another retention is left as it is", existing: "3600000", wantMs: "3600000", wantLog: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addrs := cluster(t, "orders")
			cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			adm := kadm.NewClient(cl)
			ctx := context.Background()
			dlq := DeadLetterTopic("orders", "g")
			if tt.existing != "" {
				if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"retention.ms": kadm.StringPtr(tt.existing)}, dlq); err != nil {
					t.Fatal(err)
				}
			}
			var logs bytes.Buffer
			c, err := New(Options{Name: "test", Brokers: addrs, Topic: "orders", Group: "g", Declare: true,
				DeadLetterRetention: 14 * 24 * time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.Declare(ctx); err != nil {
				t.Fatal(err)
			}
			rcs, err := adm.DescribeTopicConfigs(ctx, dlq)
			if err != nil {
				t.Fatal(err)
			}
			rc, err := rcs.On(dlq, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			for _, cfg := range rc.Configs {
				if cfg.Key == "retention.ms" && cfg.Value != nil {
					got = *cfg.Value
				}
			}
			if got != tt.wantMs {
				t.Errorf("retention.ms = %q, want %q", got, tt.wantMs)
			}
			if logged := strings.Contains(logs.String(), "retention differs"); logged != tt.wantLog {
				t.Errorf("logged a retention difference: %v, want %v\n%s", logged, tt.wantLog, logs.String())
			}
		})
	}
}
