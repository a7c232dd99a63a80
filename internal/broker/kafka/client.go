package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
)

// Options configures a Client.
type Options struct {
	// Name identifies the source in logs.
	Name    string
	Brokers []string
	Topic   string
	Group   string
	Tiers   []time.Duration
	// Declare creates the retry and dead-letter topics when missing.
	Declare bool
	// DeadLetterRetention is the retention.ms the dead-letter topic is
	// created with; zero leaves the brokers' default. An existing topic keeps
	// its own.
	DeadLetterRetention time.Duration
	// Ordering is how a partition's records are handed over; the zero
	// value is broker.OrderNone.
	Ordering broker.Ordering
	// MaxInFlight bounds records handed out and not yet answered: Kafka
	// has no prefetch, so this is what holds intake back. Zero means 256.
	// A record the app has answered whose outcome is being committed
	// (Answered) leaves this window; up to answeredFactor times as many
	// wait so, which rides out a slow commit without stopping intake.
	MaxInFlight int
	// FetchMaxBytes bounds one fetch; zero keeps the client's default
	// (50 MiB). The client buffers one fetch at a time: Consume takes only
	// the records it can hand out.
	FetchMaxBytes int32
	// RevokeTimeout bounds how long a revoked partition's records in flight
	// may finish before they are abandoned; zero means 10s.
	RevokeTimeout time.Duration
	// SessionTimeout is the group session timeout; zero keeps the client's
	// default (45s).
	SessionTimeout time.Duration
	// InstanceID, when set, makes the group member static (KIP-345): a
	// member that stopped without leaving and comes back with the same id
	// takes its partitions back at once, without waiting out the session
	// timeout. It must be unique in the group. Close removes the member from
	// the group, which closing a static member's client does not do.
	InstanceID string
	// TransactionalID, when set, makes every transfer and offset commit
	// transactional: a copy commits together with the offset of the record
	// it settles. It must be unique among the group's members and should
	// stay the same across a member's restarts.
	TransactionalID string
	// MaxMessageBytes is the largest body the sidecar hands to the app
	// (handler.max_message_bytes), and so the largest a retry copy
	// carries: the producer's batches and the derived topics are sized for
	// it. A larger record is dead-lettered through a producer of its own.
	// Zero means 1 MiB, the brokers' default record bound.
	MaxMessageBytes int
	// Marks, when set, keeps each partition's highest offset handed out,
	// durably before the records are handed out: a record at or below the
	// mark found at assignment may have reached the app before (a restart
	// after a crash), and its delivery says Redelivered. Kafka itself has no
	// such flag.
	Marks Marks
	// StartAtEnd makes a group that has committed nothing on a partition of
	// the topic start at its end, not its start: records produced before
	// the group first consumed are not taken. The end found is committed at
	// once, so that a crash before the first record settles does not move
	// the start to a later end. Retry topics always start at their start.
	// Not with TransactionalID, whose commits go with copies only.
	StartAtEnd bool
	// Share makes Group a share group (KIP-932, share.go): Topic is
	// consumed through it by ShareSource, one record acknowledged at a
	// time, and the retry topics by the client's own poll loop in the
	// consumer group ShareRetryGroup(Group), where InstanceID is the
	// member's static id. Ordering must be none, without TransactionalID.
	Share bool
	// Extra are further client options (TLS, SASL, tests' timeouts).
	Extra  []kgo.Opt
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// hooks hold the client at points of its making, for tests.
	hooks *madeHooks

	// heldAtLeast is the fewest answered records held out of the window:
	// zero means minAnsweredHeld, below zero none (tests of the factor
	// alone).
	heldAtLeast int
}

// madeHooks are called, when set, while a client is being made.
type madeHooks struct {
	// made: franz-go's NewClient returned, its group already joining;
	// Client.cl is not set yet.
	made func()
	// startAtEnd: startAtEnd has fresh partitions and needs the client.
	startAtEnd func()
}

// Client consumes a topic and its retry topics in one consumer group and
// produces copies. Consume runs its poll loop; Transfer may be called
// concurrently; Close commits and leaves the group.
type Client struct {
	o  Options
	cl *kgo.Client
	// clSet is closed once cl is set. franz-go starts the group's
	// membership inside NewClient, so a hook that needs the client
	// (startAtEnd) may run before NewClient has returned it.
	clSet chan struct{}
	// balancer is the group's own balancer (balance.go).
	balancer *perTopicBalancer
	log      *slog.Logger
	now      func() time.Time
	sem      chan struct{} // a slot for each record handed out and not answered
	held     chan struct{} // a slot for each record handed out and not settled
	// answeredBytes is what the records answered out of the window hold,
	// up to maxAnswered.
	answeredBytes atomic.Int64
	maxAnswered   int64
	retry         map[string]bool // retry topics

	// group is the consumer group the poll loop consumes in: Group, or
	// with Share the one that reads its retry topics.
	group string
	// share consumes Topic through the share group; nil unless Share.
	share *ShareSource

	txn *committer // nil unless transactional
	// plain produces replayed copies for a transactional client, whose own
	// producer cannot produce outside a transaction; made on first use.
	plainMu sync.Mutex
	plain   *kgo.Client

	// sharedDown: the last write of the shared marks failed (shared.go).
	sharedDown atomic.Bool

	mu    sync.Mutex
	parts map[topicPartition]*partition

	timers sync.WaitGroup // resume timers of paused partitions, and marks being written
	closed chan struct{}
	once   sync.Once
}

type topicPartition struct {
	topic     string
	partition int32
}

// partition is one assigned partition's state.
type partition struct {
	tp   topicPartition
	wm   watermark
	lost chan struct{} // closed when the partition is revoked or lost
	gone bool          // revoked: records still buffered are not handed out
	// from is the offset of the next record to hand out: a rewound fetch
	// (an aborted transaction rewinds to the last commit) does not hand out
	// a record twice. Written by the poll loop, read by the committer.
	from atomic.Int64
	// committed is the last offset a transaction committed (transactional
	// clients only); -1 before the first.
	committed int64
	// handedBefore is the highest offset handed out before this
	// assignment, by the marks (-1: none). markTarget is the highest mark
	// asked for, and markPending closed once it is written; both belong to
	// the poll loop. markDurable is the highest mark written.
	handedBefore, markTarget int64
	// topicID is the partition's topic's id, hex-encoded, as the brokers
	// told it at assignment ("" when they did not): the marks are its.
	topicID     string
	markPending <-chan struct{}
	markDurable atomic.Int64
	// ahead is how far the last mark went past the record it was set at,
	// markTop, at markAt (nextAhead); the poll loop's.
	ahead, markTop int64
	markAt         time.Time

	mu  sync.Mutex
	out map[*delivery]struct{} // handed out, neither acked nor released

	// markMu guards marks, what settle hands MarkCommitOffsets (which reads
	// it and keeps none of it): made once for the partition, not twice a
	// settle.
	markMu sync.Mutex
	marks  map[string]map[int32]kgo.EpochOffset
}

// markCommit marks the partition's offsets below next for the next commit.
func (p *partition) markCommit(cl *kgo.Client, next int64, epoch int32) {
	p.markMu.Lock()
	defer p.markMu.Unlock()
	if p.marks == nil {
		p.marks = map[string]map[int32]kgo.EpochOffset{p.tp.topic: make(map[int32]kgo.EpochOffset, 1)}
	}
	p.marks[p.tp.topic][p.tp.partition] = kgo.EpochOffset{Epoch: epoch, Offset: next}
	cl.MarkCommitOffsets(p.marks)
}

func (p *partition) isLost() bool {
	select {
	case <-p.lost:
		return true
	default:
		return false
	}
}

// outstanding is how many of the partition's deliveries are neither acked
// nor released.
func (p *partition) outstanding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.out)
}

// finish takes d off the partition's outstanding set and frees its slots;
// it reports false when d was finished already.
func (p *partition) finish(d *delivery, c *Client) bool {
	p.mu.Lock()
	_, ok := p.out[d]
	delete(p.out, d)
	p.mu.Unlock()
	if ok {
		d.finished()
		<-c.held
	}
	return ok
}

// answeredFactor is how many records answered and waiting for their
// outcome's commit may be held for each of MaxInFlight: a commit that
// stalls on the disk for a few hundred milliseconds at thousands of records
// a second is ridden out without stopping intake, and the wait's memory
// stays bounded (the record and its walk, about 3 KB for a 1 KiB message).
const answeredFactor = 16

// minAnsweredHeld is the fewest answered records held out of the window
// whatever MaxInFlight: a small window (twice the calls in flight, with
// ordering none) fills in milliseconds, but a commit stalled on the disk
// lasts as long at any window, and as many records arrive meanwhile.
const minAnsweredHeld = 4096

// maxAnsweredBytes bounds the keys and bodies of the records held answered
// out of the window: with large messages, the window is what bounds memory.
const maxAnsweredBytes = 16 << 20

func heldAtLeast(o Options) int {
	if o.heldAtLeast == 0 {
		return minAnsweredHeld
	}
	return max(o.heldAtLeast, 0)
}

// New builds a client; nothing is consumed until Consume.
func New(o Options) (*Client, error) {
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 256
	}
	if o.RevokeTimeout <= 0 {
		o.RevokeTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	c := &Client{
		o:           o,
		log:         o.Logger.With("source", o.Name, "topic", o.Topic, "group", o.Group),
		now:         o.Now,
		sem:         make(chan struct{}, o.MaxInFlight),
		held:        make(chan struct{}, max(answeredFactor*o.MaxInFlight, heldAtLeast(o))),
		maxAnswered: maxAnsweredBytes,
		retry:       map[string]bool{},
		parts:       map[topicPartition]*partition{},
		closed:      make(chan struct{}),
		clSet:       make(chan struct{}),
		balancer:    &perTopicBalancer{},
	}
	if o.Share && (o.TransactionalID != "" || (o.Ordering != "" && o.Ordering != broker.OrderNone)) {
		return nil, errors.New("kafka share group: ordering must be none, without a transactional id")
	}
	c.group = o.Group
	topics := []string{o.Topic}
	if o.Share {
		c.group = ShareRetryGroup(o.Group)
		topics = nil
	}
	for _, t := range o.Tiers {
		rt := RetryTopic(o.Topic, o.Group, t)
		c.retry[rt] = true
		topics = append(topics, rt)
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(o.Brokers...),
		kgo.ConsumerGroup(c.group),
		kgo.ConsumeTopics(topics...),
		kgo.Balancers(groupBalancers(c.balancer)...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.revoked),
	}
	if o.StartAtEnd {
		opts = append(opts, kgo.AdjustFetchOffsetsFn(c.startAtEnd))
	}
	if o.TransactionalID == "" {
		opts = append(opts,
			kgo.AutoCommitMarks(),
			// Commit often: a crashed member's successor redoes what was
			// settled after the last commit.
			kgo.AutoCommitInterval(commitInterval))
	} else {
		opts = append(opts,
			kgo.TransactionalID(o.TransactionalID),
			// A crashed member's open transaction holds back readers of
			// its topics until it times out (or the member restarts with
			// the same id); the sidecar's transactions are short.
			kgo.TransactionTimeout(10*time.Second),
			// Copies of aborted transactions are never seen.
			kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	opts = append(opts, sizeOpts(c.copyMax())...)
	opts = append(opts, o.Extra...)
	if o.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(o.SessionTimeout))
	}
	if o.FetchMaxBytes > 0 {
		opts = append(opts, kgo.FetchMaxBytes(o.FetchMaxBytes))
	}
	if o.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(o.InstanceID))
	}
	if o.TransactionalID == "" {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return nil, fmt.Errorf("kafka client: %w", err)
		}
		if o.hooks != nil && o.hooks.made != nil {
			o.hooks.made()
		}
		c.cl = cl
		close(c.clSet)
		if o.Share {
			if c.share, err = newShareSource(c); err != nil {
				cl.Close()
				return nil, err
			}
		}
		return c, nil
	}
	s, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka transactional client: %w", err)
	}
	c.cl = s.Client()
	close(c.clSet)
	c.txn = newCommitter(c, s)
	go c.txn.run()
	return c, nil
}

func (c *Client) partition(topic string, p int32) *partition {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.parts[topicPartition{topic, p}]
	if st == nil || st.gone {
		return nil
	}
	return st
}

// Consume polls until ctx is done and calls deliver for each record, from
// this goroutine, in partition order. It blocks while MaxInFlight records
// are unsettled. A retry topic's partition whose next record is not yet due
// is paused until it is, and the poll goes on for the others.
func (c *Client) Consume(ctx context.Context, deliver func(broker.Delivery)) error {
	if len(c.retry) == 0 && c.share != nil {
		<-ctx.Done() // a share group's source without retry topics: nothing here
		return nil
	}
	for {
		// Take only as many records as can be handed out now: the rest stay
		// buffered in the client, which fetches no more until they are
		// taken, so memory holds one fetch, not one being handed out and
		// the next.
		fetches := c.cl.PollRecords(ctx, max(min(cap(c.sem)-len(c.sem), cap(c.held)-len(c.held)), 1))
		if ctx.Err() != nil {
			return nil
		}
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, p int32, err error) {
			switch why, refused := Refusal(err); {
			case errors.Is(err, context.Canceled):
			case refused:
				c.log.Error("kafka refused the sidecar: "+why, "fetch_topic", topic, "partition", p, "err", err)
			default:
				c.log.Warn("kafka fetch error", "fetch_topic", topic, "partition", p, "err", err)
			}
		})
		if c.o.Marks != nil {
			c.markHandedOut(ctx, fetches)
		}
		stop := false
		fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
			if stop {
				return
			}
			st := c.partition(ftp.Topic, ftp.Partition)
			if st == nil {
				return
			}
			for _, r := range ftp.Records {
				if r.Offset < st.from.Load() {
					continue // handed out already, fetched again after a rewind
				}
				if c.retry[r.Topic] {
					if due, ok := nextDue(r); ok && c.now().Before(due) {
						c.pauseUntil(st, r, due)
						return
					}
				}
				select {
				case c.held <- struct{}{}:
				case <-ctx.Done():
					stop = true
					return
				}
				select {
				case c.sem <- struct{}{}:
				case <-ctx.Done():
					<-c.held
					stop = true
					return
				}
				d := c.newDelivery(st, r)
				if r.Offset > st.markDurable.Load() {
					d.durable = st.markPending
				}
				// Revoked while this waited for a slot: its records are the
				// next owner's. Checked under st.mu, which the revoke's
				// sweep of st.out takes after closing lost, so every
				// delivery handed out is either swept or never handed out,
				// and no slot leaks.
				st.mu.Lock()
				if st.isLost() {
					st.mu.Unlock()
					<-c.sem
					<-c.held
					return
				}
				st.out[d] = struct{}{}
				st.mu.Unlock()
				st.wm.track(r.Offset, r.LeaderEpoch)
				st.from.Store(r.Offset + 1)
				deliver(d)
			}
		})
		if stop {
			return nil
		}
	}
}

// pauseUntil pauses st and rewinds it, so r is fetched again once the
// partition resumes at due. Setting an offset drops what the client had
// buffered and not yet handed to Consume, for every partition: those records
// are fetched again (retry topics pause rarely, and hold few records).
//
// The rewind goes to the partition's commit watermark, not to r: franz-go's
// SetOffsets also moves the offset that the next commit of marks sends, and
// MarkCommitOffsets never moves it back. Rewound to r, the commit would pass
// the records handed out before r and still in flight, and a crash, or a
// record handed back at shutdown, would lose them. The records between the
// watermark and r come again and are passed over (they are below st.from).
func (c *Client) pauseUntil(st *partition, r *kgo.Record, due time.Time) {
	tps := map[string][]int32{r.Topic: {r.Partition}}
	c.cl.PauseFetchPartitions(tps)
	at := kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
	if next, epoch, ok := st.wm.peek(nil); ok && next < r.Offset {
		at = kgo.EpochOffset{Epoch: epoch, Offset: next}
	}
	c.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{r.Topic: {r.Partition: at}})
	wait := due.Sub(c.now())
	c.timers.Add(1)
	go func() {
		defer c.timers.Done()
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
			c.cl.ResumeFetchPartitions(tps)
		case <-c.closed:
		case <-st.lost:
			// The pause belongs to the client, not to the assignment: left
			// in place it would outlive the revoke, and should the
			// partition come back to this member it would never be
			// fetched again. Its next owner pauses it anew if its head is
			// still not due.
			c.cl.ResumeFetchPartitions(tps)
		}
	}()
}

func nextDue(r *kgo.Record) (time.Time, bool) {
	for _, h := range r.Headers {
		if h.Key == broker.HeaderNextDue {
			t, err := broker.ParseTime(h.Key, string(h.Value))
			return t, err == nil
		}
	}
	return time.Time{}, false
}

// HoldRetries stops fetching the retry topics while hold is true: records
// already fetched are still handed out. Partitions paused until their head
// record is due stay paused either way.
func (c *Client) HoldRetries(hold bool) {
	topics := make([]string, 0, len(c.retry))
	for t := range c.retry {
		topics = append(topics, t)
	}
	if hold {
		c.cl.PauseFetchTopics(topics...)
	} else {
		c.cl.ResumeFetchTopics(topics...)
	}
}

// Ping reports whether a broker answers.
func (c *Client) Ping(ctx context.Context) error { return c.cl.Ping(ctx) }

// settle marks d done and moves its partition's commit mark.
func (c *Client) settle(d *delivery) {
	if !d.st.finish(d, c) {
		return
	}
	next, epoch, moved := d.st.wm.settle(d.r.Offset)
	if moved && c.txn == nil { // a transactional client commits in its transactions
		d.st.markCommit(c.cl, next, epoch)
	}
}

// Close commits the watermark of every partition, leaves the group and
// closes the client, and the producer of replayed copies if one was made. Call it after every delivery is settled or handed back.
// It is safe to call twice.
func (c *Client) Close() error {
	var err error
	c.once.Do(func() {
		close(c.closed)
		c.timers.Wait()
		if c.share != nil {
			c.share.close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c.txn != nil {
			c.txn.close()
		} else {
			err = c.cl.CommitMarkedOffsets(ctx)
		}
		c.leave()
		c.cl.Close()
		c.closePlainProducer()
	})
	return err
}
