package rabbitmq

import (
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

// Per-tag states in an acker.
const (
	tagOpen  uint8 = iota // delivered, not settled
	tagAcked              // settled by Ack, ack not yet sent
	tagSent               // ack or nack sent
)

// acker settles the deliveries of one consumer channel. Acks are coalesced:
// one basic.ack with multiple set covers the settled prefix of delivery tags,
// and never a delivery still open or handed back, so a multiple ack can only
// settle what was settled one by one. A release (nack with requeue) is sent
// at once, before any multiple ack that spans it.
//
// The broker numbers a channel's deliveries 1, 2, 3…; base is the lowest tag
// not yet covered, state[i] the state of tag base+i.
type acker struct {
	ch      *amqp.Channel
	maxHeld int
	// calls serializes the channel's synchronous methods (the consumer's
	// cancel, the final close): amqp091-go matches a reply to whichever
	// caller reads it first, and two at once can wait forever.
	calls sync.Mutex

	mu      sync.Mutex
	base    uint64
	state   []uint8
	held    int       // acked-but-unsent tags above the first open one
	heldAt  time.Time // when the oldest of them was acked
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
		ch: ch, maxHeld: max(prefetch/4, 1), base: 1,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go a.run()
	return a
}

func (a *acker) slot(tag uint64) int {
	i := int(tag - a.base)
	for len(a.state) <= i {
		a.state = append(a.state, tagOpen)
	}
	return i
}

// ack settles tag; the frame goes out with the next flush.
func (a *acker) ack(tag uint64) error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return amqp.ErrClosed
	}
	if tag >= a.base {
		a.state[a.slot(tag)] = tagAcked
		if tag != a.base {
			if a.held == 0 {
				a.heldAt = time.Now()
			}
			a.held++
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
	a.mu.Unlock()
	if closed {
		return amqp.ErrClosed
	}
	// Sent before the tag is marked: until then it counts as open, and no
	// multiple ack can cover it.
	if err := a.ch.Nack(tag, false, true); err != nil {
		return err
	}
	a.mu.Lock()
	if tag >= a.base {
		a.state[a.slot(tag)] = tagSent
	}
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

// flush sends what is due: one multiple ack over the settled prefix, and the
// held acks behind an open tag once there are too many or they waited too
// long (all of them when final). It returns how long until the held ones are
// due, or zero when none are held.
func (a *acker) flush(final bool) time.Duration {
	a.mu.Lock()
	var upTo uint64
	covered := 0
	k := 0
	for k < len(a.state) && a.state[k] != tagOpen {
		if a.state[k] == tagAcked {
			upTo = a.base + uint64(k)
			covered++
		}
		k++
	}
	a.base += uint64(k)
	a.state = a.state[k:]
	if len(a.state) == 0 {
		a.state = a.state[:0:0] // let the drained array go
	}
	// Held acks that the prefix just covered no longer wait.
	held := 0
	for _, s := range a.state {
		if s == tagAcked {
			held++
		}
	}
	a.held = held
	var singles []uint64
	var wait time.Duration
	if held > 0 {
		age := time.Since(a.heldAt)
		if final || held >= a.maxHeld || age >= ackHold {
			for i, s := range a.state {
				if s == tagAcked {
					a.state[i] = tagSent
					singles = append(singles, a.base+uint64(i))
				}
			}
			a.held = 0
		} else {
			wait = ackHold - age
		}
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
