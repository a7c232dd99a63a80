// Package brokertest is the contract every broker adapter passes, as the
// engine uses it (dispatch's Source, Transferer and CopyFinder): what a
// delivery carries, what Ack and Release do, that a delivery lost with its
// consumer comes back, that one consumer gets a source's messages in order,
// what the retry and dead-letter copies keep, and that a copy is found
// again after a crash. Each adapter's tests run it against its broker through
// a Fixture; broker differences are Capabilities, not skipped tests.
package brokertest

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/testkit"
)

// Consumer is an adapter's intake, the source and its retry path, as the
// engine consumes it; Transferer moves its copies.
type (
	Consumer   = dispatch.Source
	Transferer = dispatch.Transferer
)

// Fixture is one adapter on fresh topology (a queue or topic of its own).
type Fixture struct {
	// Open starts a consumer and transferer on the topology; Close on the
	// returned func stops them (committing or closing as the adapter does).
	Open func(t *testing.T) (Consumer, Transferer, func())
	// Publish sends a message into the source with the given id, body and
	// headers.
	Publish func(t *testing.T, id string, body []byte, headers map[string]string)
	// DeadLetters reads every copy in the dead-letter destination.
	DeadLetters func(t *testing.T) []broker.Message
	// Tier is a delay tier the topology has.
	Tier time.Duration
}

// Capabilities says how an adapter's broker differs.
type Capabilities struct {
	// ReleaseRedeliversAtOnce: a released delivery comes back to the same
	// consumer (RabbitMQ requeue). Otherwise it comes back to the next
	// consumer of its partition (Kafka: its offset is not committed).
	ReleaseRedeliversAtOnce bool
	// FlagsRedelivery: a delivery that comes back after its consumer
	// stopped says so (RabbitMQ's redelivered flag). Kafka's says so only
	// from the handed-out marks, which the contract's client has none of.
	FlagsRedelivery bool
	// FindsRetryCopies: a copy in a retry tier can be looked for as a
	// dead-letter copy can (Kafka's retry topics are logs; RabbitMQ's
	// delay queues are not).
	FindsRetryCopies bool
}

// collector gathers deliveries from a running consumer.
type collector struct {
	mu  sync.Mutex
	got []broker.Delivery
}

func (c *collector) add(d broker.Delivery) {
	c.mu.Lock()
	c.got = append(c.got, d)
	c.mu.Unlock()
}

func (c *collector) wait(t *testing.T, n int, timeout time.Duration) []broker.Delivery {
	t.Helper()
	var got []broker.Delivery
	testkit.Eventually(t, timeout, fmt.Sprintf("%d deliveries", n), func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		got = append(got[:0], c.got...)
		return len(got) >= n
	})
	return got
}

// consume runs a consumer until the returned stop is called.
func consume(t *testing.T, f Fixture) (*collector, Transferer, func()) {
	t.Helper()
	cons, tr, closeFn := f.Open(t)
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cons.Consume(ctx, c.add)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			closeFn()
		})
	}
	t.Cleanup(stop)
	return c, tr, stop
}

// Run runs the contract. newFixture makes a fixture on fresh topology.
func Run(t *testing.T, newFixture func(t *testing.T) Fixture, caps Capabilities) {
	t.Run("a delivery carries the message", func(t *testing.T) {
		f := newFixture(t)
		body := []byte{0, 1, 2, 'x', 0xff}
		f.Publish(t, "m-1", body, map[string]string{"x-tenant": "acme", "handoff-attempt": "9"})
		c, _, _ := consume(t, f)
		d := c.wait(t, 1, 15*time.Second)[0]
		m := d.Message()
		if !bytes.Equal(m.Body, body) || m.Headers["x-tenant"] != "acme" || m.Copy {
			t.Errorf("message = %+v", m)
		}
		if m.Origin == "" {
			t.Error("no origin")
		}
		if err := d.Ack(); err != nil {
			t.Errorf("Ack: %v", err)
		}
	})

	t.Run("an acked delivery does not come back", func(t *testing.T) {
		f := newFixture(t)
		f.Publish(t, "m-2", []byte("a"), nil)
		f.Publish(t, "m-3", []byte("b"), nil)
		c, _, stop := consume(t, f)
		for _, d := range c.wait(t, 2, 15*time.Second) {
			if string(d.Message().Body) == "a" {
				_ = d.Ack()
			} else {
				_ = d.Release()
			}
		}
		if caps.ReleaseRedeliversAtOnce {
			again := c.wait(t, 3, 15*time.Second)[2]
			if string(again.Message().Body) != "b" || !again.Message().Redelivered {
				t.Errorf("redelivered %q (redelivered=%v), want b, true", again.Message().Body, again.Message().Redelivered)
			}
			_ = again.Ack()
			stop()
			return
		}
		stop()
		c2, _, _ := consume(t, f)
		again := c2.wait(t, 1, 30*time.Second)[0]
		if string(again.Message().Body) != "b" {
			t.Errorf("the next consumer got %q first, want the released b", again.Message().Body)
		}
		time.Sleep(500 * time.Millisecond)
		c2.mu.Lock()
		defer c2.mu.Unlock()
		for _, d := range c2.got {
			if string(d.Message().Body) == "a" {
				t.Error("the acked message came back")
			}
			_ = d.Ack() // settled, so closing has nothing to wait for
		}
	})

	t.Run("a dead-letter copy keeps the message and adds the trail", func(t *testing.T) {
		f := newFixture(t)
		f.Publish(t, "m-4", []byte("poison"), map[string]string{"x-tenant": "acme"})
		c, tr, _ := consume(t, f)
		d := c.wait(t, 1, 15*time.Second)[0]
		trail := broker.Trail{EventID: "m-4", Attempt: 1, Hops: 1, FirstAttemptAt: time.Now(),
			Deadline: time.Now().Add(time.Hour), DeadReason: "permanent", Error: "HTTP 422"}
		if err := tr.Transfer(context.Background(), broker.Destination{DeadLetter: true}, d.Message(), trail.Headers()); err != nil {
			t.Fatalf("Transfer: %v", err)
		}
		_ = d.Ack()
		var dead []broker.Message
		deadline := time.Now().Add(15 * time.Second)
		for len(dead) == 0 && time.Now().Before(deadline) {
			dead = f.DeadLetters(t)
			time.Sleep(50 * time.Millisecond)
		}
		if len(dead) != 1 {
			t.Fatalf("dead letters: %d, want 1", len(dead))
		}
		m := dead[0]
		if string(m.Body) != "poison" || m.Headers["x-tenant"] != "acme" {
			t.Errorf("DLQ copy lost the message: %+v", m)
		}
		got, err := broker.ParseTrail(m.Headers)
		if err != nil || got.EventID != "m-4" || got.Hops != 1 || got.DeadReason != "permanent" {
			t.Errorf("DLQ trail = %+v, %v", got, err)
		}
	})

	t.Run("a retry copy comes back as a copy, no earlier than its tier", func(t *testing.T) {
		f := newFixture(t)
		f.Publish(t, "m-5", []byte("later"), nil)
		c, tr, _ := consume(t, f)
		d := c.wait(t, 1, 15*time.Second)[0]
		now := time.Now()
		trail := broker.Trail{EventID: "m-5", Attempt: 1, Hops: 1, FirstAttemptAt: now,
			Deadline: now.Add(time.Hour), NextDue: now.Add(f.Tier)}
		if err := tr.Transfer(context.Background(), broker.Destination{Tier: f.Tier}, d.Message(), trail.Headers()); err != nil {
			t.Fatalf("Transfer: %v", err)
		}
		_ = d.Ack()
		back := c.wait(t, 2, 30*time.Second)[1]
		if waited := time.Since(now); waited < f.Tier {
			t.Errorf("the copy came back after %v, before its tier %v", waited, f.Tier)
		}
		m := back.Message()
		if !m.Copy || string(m.Body) != "later" {
			t.Errorf("copy = %+v", m)
		}
		if got, err := broker.ParseTrail(m.Headers); err != nil || got.EventID != "m-5" || got.Attempt != 1 {
			t.Errorf("copy trail = %+v, %v", got, err)
		}
		_ = back.Ack()
	})

	t.Run("a delivery its consumer never settled comes back to the next one", func(t *testing.T) {
		f := newFixture(t)
		f.Publish(t, "m-6", []byte("lost"), nil)
		c, _, stop := consume(t, f)
		if d := c.wait(t, 1, 15*time.Second)[0]; string(d.Message().Body) != "lost" {
			t.Fatalf("got %q", d.Message().Body)
		}
		stop() // neither acked nor released: the consumer is gone
		c2, _, _ := consume(t, f)
		again := c2.wait(t, 1, 30*time.Second)[0]
		m := again.Message()
		if string(m.Body) != "lost" {
			t.Errorf("the next consumer got %q, want the unsettled message", m.Body)
		}
		if caps.FlagsRedelivery && !m.Redelivered {
			t.Error("the message came back without its redelivered flag")
		}
		_ = again.Ack()
	})

	t.Run("one consumer gets the messages in the order they were published", func(t *testing.T) {
		f := newFixture(t)
		const n = 20
		for i := range n {
			f.Publish(t, fmt.Sprintf("o-%d", i), []byte(strconv.Itoa(i)), nil)
		}
		c, _, _ := consume(t, f)
		for i := range n {
			// Each acked as it comes: a prefetch below n holds the rest.
			d := c.wait(t, i+1, 30*time.Second)[i]
			if got := string(d.Message().Body); got != strconv.Itoa(i) {
				t.Errorf("delivery %d is message %s", i, got)
			}
			_ = d.Ack()
		}
	})

	t.Run("a copy is found after a crash, and a copy never made is not", func(t *testing.T) {
		f := newFixture(t)
		f.Publish(t, "m-7", []byte("copied"), nil)
		c, tr, _ := consume(t, f)
		d := c.wait(t, 1, 15*time.Second)[0]
		finder, ok := tr.(dispatch.CopyFinder)
		if !ok {
			t.Fatal("the adapter cannot look a copy up (dispatch.CopyFinder)")
		}
		since := time.Now()
		dests := []broker.Destination{{DeadLetter: true}}
		if caps.FindsRetryCopies {
			dests = append(dests, broker.Destination{Tier: f.Tier})
		}
		trail := broker.Trail{EventID: "m-7", Attempt: 1, Hops: 1, FirstAttemptAt: since,
			Deadline: since.Add(time.Hour), NextDue: since.Add(time.Hour), DeadReason: "permanent"}
		for _, dest := range dests {
			if err := tr.Transfer(context.Background(), dest, d.Message(), trail.Headers()); err != nil {
				t.Fatalf("Transfer to %v: %v", dest, err)
			}
		}
		// Settled with its copies: a transactional transfer commits them
		// with the source's offset, and an aborted one leaves no copy to
		// find.
		if err := d.Ack(); err != nil {
			t.Fatalf("Ack: %v", err)
		}
		never := trail
		never.Hops = 2 // the next hop's copy, never made
		for _, dest := range dests {
			// Looked up as the engine does after a crash between the
			// broker's confirm and its record of it.
			found, err := finder.FindCopy(context.Background(), dest, trail.Headers(), since)
			if err != nil || !found {
				t.Errorf("%v: the copy made is not found (%v)", dest, err)
			}
			if found, err := finder.FindCopy(context.Background(), dest, never.Headers(), since); err != nil || found {
				t.Errorf("%v: a copy never made is found (%v, %v)", dest, found, err)
			}
		}
	})
}
