package sidecar

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/config"
)

// On the local RabbitMQ: a publish to a queue nobody declared fails, rather
// than being confirmed into nowhere; declare creates the queue once, and
// then the publish is taken.
func TestDeclareThenPublishRabbitMQ(t *testing.T) {
	brokertest.SkipShort(t, "RabbitMQ")
	var b [4]byte
	_, _ = rand.Read(b[:])
	q := "tools-" + hex.EncodeToString(b[:])
	cfg := buildConfig(t)
	cfg.Sources = []config.Source{{Name: "orders", RabbitMQ: &config.RabbitMQ{URL: brokertest.RabbitURL(), Queue: q, Prefetch: 16}}}
	ctx := context.Background()
	msgs := []Message{{ID: "m-1", ContentType: "text/plain", Body: []byte("x")}}
	t.Cleanup(func() {
		conn, err := dialRabbit("cleanup", cfg.Sources[0].RabbitMQ)
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	if err := Publish(ctx, cfg, "", msgs); err == nil || !strings.Contains(err.Error(), "took no message") {
		t.Fatalf("publish to an undeclared queue: %v, want it refused", err)
	}
	for i, want := range []bool{true, false} {
		d, err := Declare(ctx, cfg, "orders", 1)
		if err != nil || d.Created != want || d.Name != q {
			t.Fatalf("declare %d: %+v, %v; want created %v", i+1, d, err, want)
		}
	}
	if err := Publish(ctx, cfg, "orders", msgs); err != nil {
		t.Fatalf("publish to the declared queue: %v", err)
	}
}
