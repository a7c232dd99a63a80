package deadletter

import (
	"context"
	"errors"
	"testing"
)

func TestMessage(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, true)
	f.dlq.add(0, t0, deadLetter("ev-0", "permanent"))
	f.dlq.add(1, t0, deadLetter("ev-1", "permanent"))
	f.dlq.add(1, t0, deadLetter("ev-2", "permanent"))
	tests := []struct {
		name  string
		id    ID
		event string
		err   error
	}{
		{name: "first partition", id: ID{Log: "orders.billing.dlq", Partition: 0, Offset: 0}, event: "ev-0"},
		{name: "other partition", id: ID{Log: "orders.billing.dlq", Partition: 1, Offset: 1}, event: "ev-2"},
		{name: "not yet", id: ID{Log: "orders.billing.dlq", Partition: 1, Offset: 2}, err: ErrNotFound},
		{name: "other log", id: ID{Log: "x.dlq", Partition: 1, Offset: 0}, err: ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Message(ctx, f.src, tt.id)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Message = %v, %v; want %v", m, err, tt.err)
				}
				return
			}
			if err != nil || m.Headers["handoff-event-id"] != tt.event || string(m.Body) != `{"amount":"invalid"}` {
				t.Fatalf("Message = %+v, %v", m, err)
			}
		})
	}
	f.dlq.truncate(1, 2)
	if _, err := Message(ctx, f.src, ID{Log: "orders.billing.dlq", Partition: 1, Offset: 1}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removed by retention: %v", err)
	}
}
