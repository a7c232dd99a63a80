package rabbitmq

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/brokertest"
)

// Coalesced acks settle many deliveries per frame, yet never cover a
// delivery still in flight or one handed back: after the close, exactly the
// one left open is back in the queue, and the released one came back at once.
func TestAckerCoalescesButNeverCoversAnOpenDelivery(t *testing.T) {
	t.Parallel()
	ch := channel(t)
	q := sourceQueue(t, ch, "acker")
	const n, open, released = 200, 150, 20
	for i := range n {
		if err := ch.PublishWithContext(t.Context(), "", q, false, false, amqp.Publishing{
			MessageId: strconv.Itoa(i), Body: []byte("x"), DeliveryMode: amqp.Persistent,
		}); err != nil {
			t.Fatal(err)
		}
	}

	c := NewClient(Options{Name: "acker", URL: brokertest.RabbitURL(), Queue: q, Prefetch: n + 10, Declare: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = c.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	got := make(chan broker.Delivery, 2*n)
	consumeCtx, stopConsume := context.WithCancel(ctx)
	defer stopConsume()
	go func() { _ = c.Source().Consume(consumeCtx, func(d broker.Delivery) { got <- d }) }()

	var acks *acker
	var releasedAgain bool
	var settledOnes []broker.Delivery
	for settled := 0; settled < n-1; {
		var d broker.Delivery
		select {
		case d = <-got:
		case <-time.After(15 * time.Second):
			t.Fatalf("only %d deliveries settled", settled)
		}
		dl := d.(*delivery)
		acks = dl.acks
		switch id, _ := strconv.Atoi(d.Message().MessageID); {
		case id == open:
			// Left in flight.
		case id == released && !d.Message().Redelivered:
			if err := d.Release(); err != nil {
				t.Fatal(err)
			}
		default:
			releasedAgain = releasedAgain || id == released
			if err := d.Ack(); err != nil {
				t.Fatal(err)
			}
			settledOnes = append(settledOnes, d)
			settled++
		}
	}
	if !releasedAgain {
		t.Fatal("the released delivery never came back")
	}
	// The acks behind the open delivery go out within the hold, not at the
	// close (which is only after this wait, however long it takes).
	deadline := time.Now().Add(15 * time.Second)
	for {
		frames, settled := acks.counts()
		if settled == n-1 {
			if frames >= settled/2 {
				t.Errorf("%d ack frames for %d deliveries: not coalesced", frames, settled)
			}
			t.Logf("%d ack frames settled %d deliveries", frames, settled)
			acks.mu.Lock()
			open, waiting := len(acks.open), len(acks.acked)
			acks.mu.Unlock()
			if open != 1 || waiting != 0 {
				t.Errorf("the acker keeps %d open tags and %d unsent acks, want 1 and 0", open, waiting)
			}
			// Settling twice sends nothing twice (the broker would close
			// the channel on an unknown tag).
			for _, d := range settledOnes[:2] {
				if err := d.Ack(); err != nil {
					t.Fatal(err)
				}
			}
			if err := settledOnes[2].Release(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-settledOnes[0].Lost():
				t.Fatal("the channel closed after deliveries were settled twice")
			case <-time.After(100 * time.Millisecond):
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acks sent while one delivery stays open", settled, n-1)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// A quorum queue applies settles asynchronously and, with many in
	// flight, stashes some: acks sent just before a close can come back as
	// redeliveries (which the journal settles as duplicates). Let them land,
	// so that what is left is what was never acked. Nothing over AMQP says
	// when they have (rabbitmqctl's unacked count is refreshed only every
	// 5s), so this is a window, a second long so that a loaded broker has
	// applied them.
	time.Sleep(time.Second)
	stopConsume()
	cancel()
	<-ran
	var left []string
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		left = append(left, d.MessageId)
	}
	if len(left) != 1 || left[0] != strconv.Itoa(open) {
		t.Fatalf("queue holds %v after the close, want only the open delivery %d", left, open)
	}
	if err := (&delivery{acks: acks}).Ack(); err == nil {
		t.Error("an ack after the close was accepted")
	}
}
