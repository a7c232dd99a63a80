package rabbitmq

import (
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Ack coalescing bounds. An ack that lands behind a delivery still in flight
// waits at most ackHold, and at most a quarter of the prefetch waits at
// once, so held acks never starve intake; then they go out one by one.
const ackHold = 10 * time.Millisecond

// ackGather is how long the acker lets acks gather after the first one
// before it sends: under load, one frame then settles many deliveries.
const ackGather = time.Millisecond

// acker settles the deliveries of one consumer channel. Acks are coalesced:
// one basic.ack with multiple set covers every settled delivery below the
// oldest one still open, and never an open or handed-back one, so a
// multiple ack can only settle what was settled one by one. A release (nack
// with requeue) is sent at once, before any multiple ack that spans it.
//
// It keeps only the open tags (at most the prefetch, which the broker
// enforces) and the acks not yet sent, never a slot per tag: a delivery held
// open for long must not make every flush longer.
type acker struct {
	ch      *amqp.Channel
	maxHeld int
	// calls serializes the channel's synchronous methods (the consumer's
	// cancel, the final close): amqp091-go matches a reply to whichever
	// caller reads it first, and two at once can wait forever.
	calls sync.Mutex

	mu      sync.Mutex
	open    []uint64  // delivered, not settled: ascending (tags arrive in order)
	acked   []uint64  // settled by Ack, not yet sent: ascending
	heldAt  time.Time // when the oldest ack behind an open tag was taken
	closed  bool
	frames  int // ack frames sent, for tests
	settled int // deliveries those frames settled

	wake     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func newAcker(ch *amqp.Channel, prefetch int) *acker {
	a := &acker{
		ch: ch, maxHeld: max(prefetch/4, 1),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go a.run()
	return a
}

// delivered records tag as open; the consumer calls it before handing the
// delivery on.
func (a *acker) delivered(tag uint64) {
	a.mu.Lock()
	a.open = append(a.open, tag)
	a.mu.Unlock()
}

// take removes tag from the open tags and reports whether it was open: a
// tag settled twice is settled once.
func (a *acker) take(tag uint64) bool {
	i, ok := slices.BinarySearch(a.open, tag)
	if ok {
		a.open = slices.Delete(a.open, i, i+1)
	}
	return ok
}

// ack settles tag; the frame goes out with the next flush.
func (a *acker) ack(tag uint64) error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return amqp.ErrClosed
	}
	if a.take(tag) {
		i, _ := slices.BinarySearch(a.acked, tag)
		a.acked = slices.Insert(a.acked, i, tag)
		if len(a.open) > 0 && tag > a.open[0] && a.heldAt.IsZero() {
			a.heldAt = time.Now()
		}
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return nil
}

// release hands tag back to the broker at once.
func (a *acker) release(tag uint64) error {
	a.mu.Lock()
	closed := a.closed
	_, open := slices.BinarySearch(a.open, tag)
	a.mu.Unlock()
	if closed {
		return amqp.ErrClosed
	}
	if !open {
		return nil // settled already: a second nack would close the channel
	}
	// Sent before the tag leaves the open ones: until then no multiple ack
	// can cover it.
	if err := a.ch.Nack(tag, false, true); err != nil {
		return err
	}
	a.mu.Lock()
	a.take(tag)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return nil
}

func (a *acker) run() {
	defer close(a.done)
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	gather := time.NewTimer(time.Hour)
	gather.Stop()
	for {
		select {
		case <-a.wake:
			gather.Reset(ackGather)
			select {
			case <-gather.C:
			case <-a.stop:
				a.final()
				return
			}
		case <-hold.C:
		case <-a.stop:
			a.final()
			return
		}
		hold.Stop()
		if wait := a.flush(false); wait > 0 {
			hold.Reset(wait)
		}
	}
}

// flush sends what is due: one multiple ack over the acks below the oldest
// open tag, and the acks held behind it once there are too many or they
// waited too long (all of them when final). It returns how long until the
// held ones are due, or zero when none are held.
func (a *acker) flush(final bool) time.Duration {
	a.mu.Lock()
	n := len(a.acked) // acks below the oldest open tag
	if len(a.open) > 0 {
		n, _ = slices.BinarySearch(a.acked, a.open[0])
	}
	var upTo uint64
	covered := n
	if n > 0 {
		upTo = a.acked[n-1]
	}
	held := a.acked[n:]
	var singles []uint64
	var wait time.Duration
	if len(held) > 0 {
		age := time.Since(a.heldAt)
		if final || len(held) >= a.maxHeld || age >= ackHold {
			singles = slices.Clone(held)
			held = held[:0]
		} else {
			wait = ackHold - age
		}
	}
	a.acked = append(a.acked[:0], held...)
	if len(a.acked) == 0 {
		a.heldAt = time.Time{}
	}
	if final {
		a.closed = true
	}
	a.mu.Unlock()

	frames, settled := 0, 0
	if upTo > 0 && a.ch.Ack(upTo, true) == nil {
		frames, settled = frames+1, settled+covered
	}
	for _, tag := range singles {
		if a.ch.Ack(tag, false) == nil {
			frames, settled = frames+1, settled+1
		}
	}
	if frames > 0 {
		a.mu.Lock()
		a.frames += frames
		a.settled += settled
		a.mu.Unlock()
	}
	return wait
}

// final sends every settled ack, then closes the channel, whose frames the
// broker handles in order. A quorum queue still applies the settles later,
// and may drop some it had stashed: deliveries acked just before a close can
// be redelivered, and the journal settles them as duplicates.
func (a *acker) final() {
	a.flush(true)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		a.calls.Lock()
		defer a.calls.Unlock()
		_ = a.ch.Close()
	}()
	// A broker that never answers must not hold up a shutdown: the
	// connection's close, which follows, ends the channel anyway.
	select {
	case <-closed:
	case <-time.After(finalCloseTimeout):
	}
}

// finalCloseTimeout bounds the wait for a consumer channel's close-ok.
const finalCloseTimeout = 5 * time.Second

// close sends every settled ack, closes the channel and stops; later acks
// fail. It is for a channel about to close, or one already gone (whose acks
// fail harmlessly: the broker has requeued those deliveries).
func (a *acker) close() {
	a.stopOnce.Do(func() { close(a.stop) })
	<-a.done
}

// counts reports the ack frames sent and the deliveries they settled.
func (a *acker) counts() (frames, settled int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.frames, a.settled
}
