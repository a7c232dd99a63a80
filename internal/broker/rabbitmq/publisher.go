package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
)

// Errors a transfer can end with.
var (
	// ErrUnroutable is returned when the broker returned a copy because no
	// queue took it (its destination queue is gone).
	ErrUnroutable = errors.New("rabbitmq: copy returned unroutable")
	// ErrNacked is returned when the broker refused to take a copy.
	ErrNacked = errors.New("rabbitmq: copy nacked by the broker")
	// ErrChannelClosed is returned when the publisher channel closed before
	// the broker confirmed a copy; whether it arrived is unknown.
	ErrChannelClosed = errors.New("rabbitmq: publisher channel closed before confirm")
	// ErrConfirmTimeout is returned when no confirm came within
	// confirmTimeout (a blocked connection, a lost confirm); whether the copy
	// arrived is unknown.
	ErrConfirmTimeout = errors.New("rabbitmq: no confirm in time")
)

// confirmTimeout bounds the wait for one publish's confirm.
const confirmTimeout = 30 * time.Second

// confirmBuffer is the depth of the confirm and return listeners. The tracker
// drains them continuously; the depth only smooths bursts.
const confirmBuffer = 1024

// publisher publishes on one confirm-mode channel and matches each publish to
// its confirm and to any basic.return the broker sent for it.
//
// RabbitMQ sends the basic.return of an unroutable mandatory publish before
// its basic.ack, and amqp091-go hands both to listeners from one goroutine in
// that order. The tracker therefore drains pending returns before it resolves
// each confirm: a returned copy is never reported as transferred.
type publisher struct {
	ch *amqp.Channel

	// pubMu serializes publishes so each one's delivery tag is the sequence
	// number read just before it.
	pubMu sync.Mutex

	// mu guards pending. It is never held across a call into the channel: the
	// library's reader may be blocked handing the tracker a confirm.
	mu      sync.Mutex
	pending map[uint64]*waiter
	closed  bool

	returns <-chan amqp.Return
	done    chan struct{}
}

type waiter struct {
	key      string // routing key + event id + attempt, to match returns
	returned bool
	result   chan error // buffered: the tracker never blocks on it
}

func newPublisher(conn *amqp.Connection, onClose func(error)) (*publisher, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	p := &publisher{
		ch:      ch,
		pending: make(map[uint64]*waiter),
		returns: ch.NotifyReturn(make(chan amqp.Return, confirmBuffer)),
		done:    make(chan struct{}),
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, confirmBuffer))
	go p.track(confirms, onClose)
	return p, nil
}

func (p *publisher) publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	wait, err := p.start(ctx, queue, msg)
	if err != nil {
		return err
	}
	return wait(ctx)
}

// start publishes msg and returns the wait for its confirm, so that a caller
// moving many messages keeps a window of them in flight.
func (p *publisher) start(ctx context.Context, queue string, msg amqp.Publishing) (func(context.Context) error, error) {
	w := &waiter{key: returnKey(queue, msg.Headers), result: make(chan error, 1)}
	p.pubMu.Lock()
	seq := p.ch.GetNextPublishSeqNo()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.pubMu.Unlock()
		return nil, ErrChannelClosed
	}
	p.pending[seq] = w
	p.mu.Unlock()
	err := p.ch.PublishWithContext(ctx, "", queue, true, false, msg)
	p.pubMu.Unlock()
	if err != nil {
		p.mu.Lock()
		delete(p.pending, seq)
		p.mu.Unlock()
		return nil, fmt.Errorf("publish to %s: %w", queue, err)
	}
	return func(ctx context.Context) error { return w.wait(ctx, queue) }, nil
}

func (w *waiter) wait(ctx context.Context, queue string) error {
	t := time.NewTimer(confirmTimeout)
	defer t.Stop()
	select {
	case err := <-w.result:
		if err != nil {
			return fmt.Errorf("publish to %s: %w", queue, err)
		}
		return nil
	case <-t.C:
		// Unknown, not failed: the caller publishes again; a second retry
		// copy is dropped by the retry consumer, a DLQ copy is looked for
		// first on a restart (FindCopy) but not here.
		return fmt.Errorf("publish to %s: %w", queue, ErrConfirmTimeout)
	case <-ctx.Done():
		return fmt.Errorf("publish to %s: waiting for confirm: %w", queue, ctx.Err())
	}
}

func (p *publisher) track(confirms <-chan amqp.Confirmation, onClose func(error)) {
	defer close(p.done)
	returns := p.returns
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.markReturned(r)
		case c, ok := <-confirms:
			if !ok {
				p.failAll()
				onClose(ErrChannelClosed)
				return
			}
			p.drainReturns(returns)
			p.resolve(c)
		}
	}
}

func (p *publisher) drainReturns(returns <-chan amqp.Return) {
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				return
			}
			p.markReturned(r)
		default:
			return
		}
	}
}

// markReturned flags every pending publish that matches the returned copy.
// Matching more than one (identical copies in flight) errs on the safe side:
// a copy wrongly flagged is transferred again, never lost.
func (p *publisher) markReturned(r amqp.Return) {
	key := returnKey(r.RoutingKey, r.Headers)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.pending {
		if w.key == key {
			w.returned = true
		}
	}
}

func (p *publisher) resolve(c amqp.Confirmation) {
	p.mu.Lock()
	w, ok := p.pending[c.DeliveryTag]
	delete(p.pending, c.DeliveryTag)
	p.mu.Unlock()
	if !ok {
		return
	}
	switch {
	case !c.Ack:
		w.result <- ErrNacked
	case w.returned:
		w.result <- ErrUnroutable
	default:
		w.result <- nil
	}
}

func (p *publisher) failAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for tag, w := range p.pending {
		w.result <- ErrChannelClosed
		delete(p.pending, tag)
	}
}

// wait returns once the tracker has stopped (after the channel closed).
func (p *publisher) wait() { <-p.done }

func returnKey(queue string, h amqp.Table) string {
	id, _ := h[broker.HeaderEventID].(string)
	attempt, _ := h[broker.HeaderAttempt].(string)
	return queue + "\x00" + id + "\x00" + attempt
}
