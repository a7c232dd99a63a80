package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
)

// The ledger stream is declared beside the dead-letter stream, appended to
// with confirms and read back from any offset; the dead-letter stream reads
// the same way, its copies' evidence intact.
func TestStreamLogs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ch := channel(t)
	q := sourceQueue(t, ch, "ledger")
	c := connected(t, q)
	if kind, _, err := inspectQueue(dial(t), LedgerQueue(q)); err != nil || kind != queueStream {
		t.Fatalf("ledger %s: kind %v, %v", LedgerQueue(q), kind, err)
	}

	led := c.LedgerLog()
	if led.Name() != q+".dlq.ledger" {
		t.Fatalf("name %s", led.Name())
	}
	if first, err := led.First(ctx); err != nil || len(first) != 0 {
		t.Fatalf("empty ledger: first %v, %v", first, err)
	}
	for i := range 3 {
		if err := led.Append(ctx, []byte(fmt.Sprintf(`{"n":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	if first, err := led.First(ctx); err != nil || first[-1] != 0 {
		t.Fatalf("first %v, %v", first, err)
	}
	read := func(log *StreamLog, from map[int32]int64) []string {
		t.Helper()
		var got []string
		err := log.Read(ctx, from, func(p int32, off int64, at time.Time, m *broker.Message) error {
			if p != -1 {
				t.Errorf("partition %d", p)
			}
			got = append(got, fmt.Sprintf("%d:%s", off, m.Body))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := fmt.Sprint(read(led, nil)); got != `[0:{"n":0} 1:{"n":1} 2:{"n":2}]` {
		t.Fatalf("from first: %s", got)
	}
	if got := fmt.Sprint(read(led, map[int32]int64{-1: 2})); got != `[2:{"n":2}]` {
		t.Fatalf("from 2: %s", got)
	}
	stop := fmt.Errorf("stop")
	n := 0
	if err := led.Read(ctx, nil, func(int32, int64, time.Time, *broker.Message) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Fatalf("an error from each: %v after %d", err, n)
	}

	msg, trail := deadLetter("ev-1", 3, amqp.Table{"k": "v"})
	if err := c.Transfer(ctx, broker.Destination{DeadLetter: true}, msg, trail); err != nil {
		t.Fatal(err)
	}
	var got []*broker.Message
	if err := c.DeadLetterLog().Read(ctx, nil, func(_ int32, _ int64, _ time.Time, m *broker.Message) error {
		got = append(got, m)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Headers[broker.HeaderEventID] != "ev-1" || got[0].Headers[broker.HeaderDeadReason] != "permanent" ||
		got[0].Headers["k"] != "v" || string(got[0].Body) != "body-ev-1" {
		t.Fatalf("dead letter read back: %+v", got)
	}
	if _, ok := got[0].Headers[streamOffsetArg]; ok {
		t.Error("the stream's offset header is passed on as the message's")
	}
}
