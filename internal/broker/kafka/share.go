package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
)

// A share group (KIP-932) hands each record to one member at a time and
// takes it back, acknowledged one by one: more members than partitions
// share a topic, and a record that fails holds back no other. The broker
// counts a record's deliveries and, at the group's limit, archives it
// without telling anyone; a record acquired is locked to its member for
// the lock duration, renewed by the member while it works on it.
//
// The source topic is consumed through the share group (ShareSource); its
// retry topics, which the sidecar writes and reads back only when a copy
// is due, through a consumer group of their own (ShareRetryGroup), by the
// Client's poll loop as before. Copies, dead letters and their ledger are
// named after the share group.

// ShareRetryGroup is the consumer group that reads a share group's retry
// topics: Kafka's groups of both kinds share one namespace, so it cannot
// be the share group's own name.
func ShareRetryGroup(group string) string { return group + ".retries" }

// ShareSource consumes the source topic through the client's share group.
// Build it with Client.ShareSource; Consume runs its poll loop.
type ShareSource struct {
	c  *Client
	cl *kgo.Client
	// limit and lock are the group's (ShareLimits), once read by Declare;
	// until then Kafka's defaults.
	limit atomic.Int32
	lock  atomic.Int64
	from  atomic.Pointer[string]
	// lost is closed when the client closes: a record not acknowledged by
	// then goes back to the group.
	lost chan struct{}
	// ready is closed once declare has set where the group starts:
	// records are not taken before, or the group's first member would
	// start it at the brokers' default.
	ready     chan struct{}
	readyOnce sync.Once
	// The renewer runs from the first Consume until close.
	renewCtx  context.Context
	stopRenew context.CancelFunc
	renewOnce sync.Once
	renewed   chan struct{}

	mu sync.Mutex
	// out holds this poll's records not yet acknowledged or released; the
	// next poll waits until it is empty (see Consume), and idle is closed
	// then.
	out  map[*shareDelivery]struct{}
	idle chan struct{}
}

// ShareSource is the client's share-group source; nil unless
// Options.Share.
func (c *Client) ShareSource() *ShareSource { return c.share }

func newShareSource(c *Client) (*ShareSource, error) {
	s := &ShareSource{c: c, lost: make(chan struct{}), ready: make(chan struct{}), renewed: make(chan struct{}), out: map[*shareDelivery]struct{}{}}
	s.renewCtx, s.stopRenew = context.WithCancel(context.Background())
	s.limit.Store(defaultShareLimit)
	s.lock.Store(int64(defaultShareLock))
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.o.Brokers...),
		kgo.ShareGroup(c.o.Group),
		kgo.ConsumeTopics(c.o.Topic),
		// One fetch a poll, of at most the window: a record fetched ahead
		// would be locked to this member, its lock running, while the
		// window's calls are still being made.
		kgo.ShareMaxRecords(int32(c.o.MaxInFlight)),
		kgo.ShareMaxRecordsStrict(),
		kgo.MaxConcurrentFetches(0),
		kgo.ShareAckCallback(s.acked),
	}
	opts = append(opts, c.o.Extra...)
	if c.o.FetchMaxBytes > 0 {
		opts = append(opts, kgo.FetchMaxBytes(c.o.FetchMaxBytes))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka share group client: %w", err)
	}
	s.cl = cl
	return s, nil
}

// declare makes the group start where the source asks (with
// Options.Declare) and reads its limits, which it logs with what they
// imply; then Consume may start. Neither stops the source when the brokers
// refuse it (an ACL on the group's configs): it says what that means and
// goes on with what it has.
func (s *ShareSource) declare(ctx context.Context) error {
	from := "earliest"
	if s.c.o.StartAtEnd {
		from = "latest"
	}
	was, changed, err := shareStart(ctx, s.cl, s.c.o.Group, from, s.c.o.Declare)
	switch {
	case err != nil && ctx.Err() != nil:
		return err
	case err != nil:
		s.c.log.Warn("kafka share group: could not read or set where it starts; a group that has consumed nothing starts where its config says (Kafka's default: the latest record, skipping what the topic holds)",
			"config", shareConfigReset, "want", from, "err", err)
	case changed:
		s.c.log.Info("kafka share group: set to start at the "+from+" record when it has consumed nothing", "config", shareConfigReset, "was", was)
	case was != from:
		s.c.log.Warn("kafka share group: it starts at the "+was+" record when it has consumed nothing, not at the "+from+" one start_from asks for, and declare is off: set the group's config, or turn declare on",
			"config", shareConfigReset)
	}
	l, err := readShareLimits(ctx, s.cl, s.c.o.Group)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		s.c.log.Warn("kafka share group: could not read its delivery limit and lock duration; assuming Kafka's defaults", "err", err)
	}
	s.limit.Store(int32(l.Limit))
	s.lock.Store(int64(l.Lock))
	s.from.Store(&l.From)
	s.c.log.Info("kafka share group: a record delivered this many times and not acknowledged is archived by the brokers; the sidecar moves it out uncalled on the delivery before (one to spare for a stop). A call longer than the lock is renewed while it runs",
		"delivery_count_limit", l.Limit, "lock_duration", l.Lock, "read_from", l.From)
	s.readyOnce.Do(func() { close(s.ready) })
	return nil
}

// finalAt is the delivery on which a record is moved out uncalled: the
// last but one before the brokers' limit, so that a stop that hands it back
// before its walk began (a drain) still leaves it a delivery to be moved
// out on; the last where the limit leaves no spare (a limit of 2, whose
// first delivery must be called).
func (s *ShareSource) finalAt() int32 {
	limit := s.limit.Load()
	if limit >= 3 {
		return limit - 1
	}
	return limit
}

// Limits are the group's delivery limit and lock duration as last read.
func (s *ShareSource) Limits() (limit int, lock time.Duration) {
	return int(s.limit.Load()), time.Duration(s.lock.Load())
}

// LimitsRead says where Limits came from: group, brokers, or defaults
// (Kafka's, until declare read them or when nothing could be read).
func (s *ShareSource) LimitsRead() string {
	if v := s.from.Load(); v != nil {
		return *v
	}
	return "defaults"
}

// acked logs acknowledgements the brokers refused: such a record comes
// back, to this member or another, and its journal or the next one's
// settles it.
func (s *ShareSource) acked(_ *kgo.Client, rs kgo.ShareAckResults) {
	if err := rs.Error(); err != nil {
		s.c.log.Warn("kafka share group: an acknowledgement was refused; its records are delivered again", "err", err)
	}
}

// Consume polls the share group until ctx is done and calls deliver for
// each record, from this goroutine, once Client.Declare has succeeded. A
// poll takes at most MaxInFlight records, and the next poll waits until
// each of them is acknowledged or released: the client accepts, at its
// next poll, every record of the previous one still unacknowledged, which
// would settle records whose next owner does not have them yet. While they
// are worked on, records held for more than a third of the lock duration
// are renewed. Records polled when ctx ends are released by Close.
func (s *ShareSource) Consume(ctx context.Context, deliver func(broker.Delivery)) error {
	select {
	case <-s.ready: // Client.Declare
	case <-ctx.Done():
		return nil
	}
	// Renewals go on past a stop of intake, while the drain's calls run,
	// until the client closes.
	s.renewOnce.Do(func() { go func() { defer close(s.renewed); s.renewer(s.renewCtx) }() })
	for {
		fetches := s.cl.PollRecords(ctx, 0)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, p int32, err error) {
			switch why, refused := Refusal(err); {
			case errors.Is(err, context.Canceled):
			case refused:
				s.c.log.Error("kafka refused the sidecar: "+why, "fetch_topic", topic, "partition", p, "err", err)
			default:
				s.c.log.Warn("kafka share fetch error", "fetch_topic", topic, "partition", p, "err", err)
			}
		})
		recs := fetches.Records()
		if len(recs) == 0 {
			continue
		}
		ds := make([]*shareDelivery, len(recs))
		for i, r := range recs {
			ds[i] = s.newDelivery(r)
		}
		idle := s.handOut(ds)
		for i, d := range ds {
			if ctx.Err() != nil {
				// Not handed out: back to the group at once, for another
				// member.
				for _, rest := range ds[i:] {
					_ = rest.Release()
				}
				return nil
			}
			deliver(d)
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return nil
		}
	}
}

// handOut records ds as this poll's outstanding records and returns what
// is closed once none is.
func (s *ShareSource) handOut(ds []*shareDelivery) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.idle = make(chan struct{})
	now := s.c.now().UnixNano()
	_, lock := s.Limits()
	for _, d := range ds {
		// Held since the poll, or since its acquisition when the brokers'
		// deadline says it was earlier (fetched ahead of the poll).
		held := now
		if dl := d.r.AcquisitionDeadline(); !dl.IsZero() {
			held = min(held, dl.Add(-lock).UnixNano())
		}
		d.held.Store(held)
		s.out[d] = struct{}{}
	}
	return s.idle
}

// finish takes d off the outstanding records, once.
func (s *ShareSource) finish(d *shareDelivery, status kgo.AckStatus) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.out[d]; !ok {
		return nil
	}
	select {
	case <-s.lost:
		// The client closed: the brokers took the record back, and an
		// acknowledgement now goes nowhere.
		delete(s.out, d)
		return errors.New("kafka share group client closed")
	default:
	}
	d.r.Ack(status)
	delete(s.out, d)
	if len(s.out) == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
	return nil
}

// renewer renews the lock of each record held for more than a third of the
// lock duration, looking every sixth of it, until ctx is done, and sends
// the renewals at once (the client would otherwise send them within a
// second): a call that outlives the lock does not see its record handed
// to another member meanwhile.
func (s *ShareSource) renewer(ctx context.Context) {
	for {
		_, lock := s.Limits()
		t := time.NewTimer(max(lock/6, 50*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		now := s.c.now().UnixNano()
		due := now - int64(lock/3)
		var renewed []*shareDelivery
		s.mu.Lock()
		for d := range s.out {
			if d.held.Load() <= due {
				d.r.Ack(kgo.AckRenew)
				renewed = append(renewed, d)
			}
		}
		s.mu.Unlock()
		if len(renewed) == 0 {
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, lock/3)
		err := s.cl.FlushAcks(fctx)
		cancel()
		if err != nil {
			// Looked at again next time: a renewal the client has not
			// sent is sent with the next flush.
			if ctx.Err() == nil {
				s.c.log.Warn("kafka share group: renewing the locks of records held past a third of the lock duration failed; another member may get them", "err", err)
			}
			continue
		}
		for _, d := range renewed {
			d.held.Store(now)
			d.renewals.Add(1)
		}
	}
}

// close sends the acknowledgements made and leaves the group; records
// still held go back to it.
func (s *ShareSource) close() {
	s.stopRenew()
	s.renewOnce.Do(func() { close(s.renewed) }) // never started
	<-s.renewed
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.cl.FlushAcks(ctx); err != nil {
		s.c.log.Warn("kafka share group: sending the last acknowledgements failed; their records are delivered again", "err", err)
	}
	s.mu.Lock()
	close(s.lost)
	s.mu.Unlock()
	s.cl.Close()
}

// shareDelivery is one record acquired through the share group.
type shareDelivery struct {
	s   *ShareSource
	r   *kgo.Record
	msg broker.Message
	// held is when the record was handed out or last renewed (unix ns).
	held     atomic.Int64
	renewals atomic.Int32
}

var _ broker.Delivery = (*shareDelivery)(nil)

func (s *ShareSource) newDelivery(r *kgo.Record) *shareDelivery {
	d := &shareDelivery{s: s, r: r, msg: recordMessage(r)}
	n := r.DeliveryCount()
	// Another member, or this one before a restart, had it: its call may
	// have reached the app.
	d.msg.Redelivered = n > 1
	d.msg.DeliveryCount = int(n - 1)
	// Near the brokers' limit: the engine moves it out without a call
	// (finalAt).
	final := s.finalAt()
	d.msg.FinalDelivery = final > 0 && n >= final
	return d
}

func (d *shareDelivery) Message() *broker.Message { return &d.msg }

// Ack accepts the record: the group is done with it.
func (d *shareDelivery) Ack() error { return d.s.finish(d, kgo.AckAccept) }

// Release hands the record back to the group, for its next delivery.
func (d *shareDelivery) Release() error { return d.s.finish(d, kgo.AckRelease) }

// Lost is closed once the client closed.
func (d *shareDelivery) Lost() <-chan struct{} { return d.s.lost }
