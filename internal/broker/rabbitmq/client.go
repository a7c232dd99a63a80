package rabbitmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/redact"
)

// Options configures a Client.
type Options struct {
	// Name identifies the source in logs and in the connection name.
	Name string
	URL  string
	// Queue is the source queue; the derived queues are named after it.
	Queue string
	// Prefetch bounds unacked deliveries per consumer.
	Prefetch int
	// DeliveryLimit is the queues' delivery limit (a quorum queue's
	// x-delivery-limit, set by argument or policy): a delivery whose
	// x-delivery-count has reached it is the message's final one, and says
	// so (broker.Message.FinalDelivery). Zero: the queues have none.
	DeliveryLimit int
	Tiers         []time.Duration
	Declare       bool
	// DeadLetterRetention is the dead-letter stream's x-max-age when the
	// client declares it; zero means DefaultDeadLetterRetention.
	DeadLetterRetention time.Duration
	Logger              *slog.Logger
	// MinBackoff and MaxBackoff bound the redial delay; zero means 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// TLS is the TLS configuration of an amqps:// URL; nil takes it from
	// the URL (the system's roots, and any certfile, keyfile and cacertfile
	// query parameters).
	TLS *tls.Config
	// Login, when set, gives the user and password for each new connection
	// instead of the URL's (read then, so a rotated password is taken up at
	// the next reconnect).
	Login func() (user, password string, err error)
}

// ErrNotConnected is returned by Transfer when there is no live connection.
var ErrNotConnected = errors.New("rabbitmq: not connected")

// Client owns one connection to RabbitMQ for one source queue and keeps it
// alive. The Sources and the Publisher it hands out use whichever connection
// is current. All methods are safe for concurrent use.
type Client struct {
	opts Options
	topo Topology
	log  *slog.Logger

	mu       sync.Mutex
	lastErr  error
	sess     *session
	changed  chan struct{} // closed and replaced whenever sess changes
	stopping bool          // Run is waiting for wg: no new watchers

	wg sync.WaitGroup // consumer-channel watchers

	finding chan struct{} // slots for reading the dead-letter stream back (FindCopy)

	readerMu      sync.Mutex
	reader        *amqp.Connection // the dead-letter logs' reads (readerConn)
	readerStopped bool
}

// NewClient returns a client; Run connects it.
func NewClient(o Options) *Client {
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	log := o.Logger.With("source", o.Name, "queue", o.Queue)
	return &Client{
		opts: o,
		topo: Topology{Queue: o.Queue, Tiers: o.Tiers, Declare: o.Declare,
			DeadLetterRetention: o.DeadLetterRetention, Logger: log},
		log:     log,
		changed: make(chan struct{}),
		finding: make(chan struct{}, maxFinds),
	}
}

// Run connects, declares the topology, and reconnects with backoff whenever
// the connection or one of its channels is lost, until ctx is done. It then
// closes the connection, which hands every unacked delivery back to the
// broker, and returns nil. Cancel ctx only after in-flight deliveries are
// settled.
func (c *Client) Run(ctx context.Context) error {
	defer c.closeReader()
	backoff := budget.NewBackoff(c.opts.MinBackoff, c.opts.MaxBackoff)
	for {
		s, err := c.connect(ctx)
		c.setLastErr(err)
		if err != nil {
			wait := backoff.Next()
			// A dial error can quote the URL, password and all.
			if why, ok := Refusal(err); ok {
				c.log.Error("rabbitmq refused the sidecar: "+why, "err", redact.Error(err), "retry_in", wait)
			} else {
				c.log.Warn("rabbitmq connect failed", "err", redact.Error(err), "retry_in", wait)
			}
			select {
			case <-ctx.Done():
				c.stop()
				return nil
			case <-time.After(wait):
			}
			continue
		}
		backoff.Reset()
		c.setSession(s)
		c.log.Info("rabbitmq connected")
		select {
		case <-ctx.Done():
			c.setSession(nil)
			s.close()
			c.stop()
			return nil
		case <-s.done:
			c.setSession(nil)
			s.close()
			c.log.Warn("rabbitmq connection lost; unacked deliveries go back to the broker", "err", redact.Error(s.err()))
		}
	}
}

// stop waits for the consumer-channel watchers; none start after it.
func (c *Client) stop() {
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	c.wg.Wait()
}

// track counts one more consumer-channel watcher, unless Run is stopping: a
// WaitGroup must not grow from zero while it is being waited for.
func (c *Client) track() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping {
		return false
	}
	c.wg.Add(1)
	return true
}

// Connected reports whether a connection is up.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess != nil && !c.sess.isDone()
}

// LastError is why the latest attempt to connect failed, redacted; nil
// once one succeeded.
func (c *Client) LastError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

func (c *Client) setLastErr(err error) {
	if err != nil {
		err = redact.Error(err)
	}
	c.mu.Lock()
	c.lastErr = err
	c.mu.Unlock()
}

// dial opens a connection named name, with the configured TLS and login.
func (c *Client) dial(name string) (*amqp.Connection, error) {
	return Dial(name, c.opts.URL, c.opts.TLS, c.opts.Login)
}

// Dial opens a connection to url named name, as a source's client does: with
// tlsConfig when not nil, and login's credentials when login is not nil
// (read at each dial, so that a rotated password file is taken up).
func Dial(name, url string, tlsConfig *tls.Config, login func() (user, password string, err error)) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	cfg := amqp.Config{
		Heartbeat:       10 * time.Second,
		Properties:      props,
		Dial:            amqp.DefaultDial(5 * time.Second),
		TLSClientConfig: tlsConfig,
	}
	if login != nil {
		user, password, err := login()
		if err != nil {
			return nil, fmt.Errorf("credentials: %w", err)
		}
		cfg.SASL = []amqp.Authentication{&amqp.PlainAuth{Username: user, Password: password}}
	}
	return amqp.DialConfig(url, cfg)
}

// Refusal reports whether err is RabbitMQ or its TLS listener refusing the
// sidecar (credentials, a vhost it may not use, certificates), which
// redialling does not mend, and says what to check.
func Refusal(err error) (string, bool) {
	var ae *amqp.Error
	switch {
	case errors.Is(err, amqp.ErrCredentials):
		return "the user name or password was not accepted: check the url's credentials or username and password_file", true
	case errors.Is(err, amqp.ErrSASL):
		return "no login mechanism in common with the broker", true
	case errors.Is(err, amqp.ErrVhost):
		return "the vhost does not exist or the user may not use it", true
	case errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
		return "access refused (" + ae.Reason + "): check the user's permissions on the vhost", true
	}
	return broker.TLSRefusal(err)
}

func (c *Client) setSession(s *session) {
	c.mu.Lock()
	c.sess = s
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// current returns the live session, or nil.
func (c *Client) current() *session {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == nil || c.sess.isDone() {
		return nil
	}
	return c.sess
}

// await returns the live session, waiting for one until ctx is done.
func (c *Client) await(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		s, changed := c.sess, c.changed
		c.mu.Unlock()
		if s != nil && !s.isDone() {
			return s, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
}

func (c *Client) connect(ctx context.Context) (*session, error) {
	conn, err := c.dial("handoff " + c.opts.Name)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	// Declaring may move the dead-letter queue into a stream, which takes
	// a while: closing the connection is what stops a call that takes no
	// context.
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	err = c.topo.declare(ctx, conn)
	stop()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("topology: %w", err)
	}
	s := &session{conn: conn, done: make(chan struct{})}
	pub, err := newPublisher(conn, s.fail)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("publisher channel: %w", err)
	}
	s.pub = pub
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		select {
		case err := <-closed:
			s.fail(connErr(err))
		case <-s.done:
		}
	}()
	return s, nil
}

// Transfer publishes a copy of msg to dest with the given handoff-* headers
// and returns once the broker has confirmed it. An unroutable copy (its queue
// is gone) is an error, never a success.
func (c *Client) Transfer(ctx context.Context, dest broker.Destination, msg *broker.Message, trail broker.Headers) error {
	s := c.current()
	if s == nil {
		return ErrNotConnected
	}
	if !dest.DeadLetter {
		return s.pub.publish(ctx, TierQueue(c.opts.Queue, dest.Tier), copyOf(msg, trail))
	}
	p := copyOf(msg, trail)
	p.Headers = streamHeaders(p.Headers)
	return s.pub.publish(ctx, DeadLetterQueue(c.opts.Queue), p)
}

// session is one connection and its publisher channel.
type session struct {
	conn *amqp.Connection
	pub  *publisher
	done chan struct{}

	once    sync.Once
	mu      sync.Mutex
	lastErr error
	ackers  []*acker // one per consumer channel, flushed before the close
}

func (s *session) addAcker(a *acker) {
	s.mu.Lock()
	s.ackers = append(s.ackers, a)
	s.mu.Unlock()
}

// fail ends the session: any lost channel means the whole connection is
// rebuilt, so every consumer and the publisher start again together. The
// broker's own reason wins over a consequence such as a closed channel.
func (s *session) fail(err error) {
	s.mu.Lock()
	var ae *amqp.Error
	if s.lastErr == nil || (errors.As(err, &ae) && !errors.As(s.lastErr, &ae)) {
		s.lastErr = err
	}
	s.mu.Unlock()
	s.once.Do(func() { close(s.done) })
}

func (s *session) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

func (s *session) isDone() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *session) close() {
	s.fail(errors.New("closed"))
	s.mu.Lock()
	ackers := s.ackers
	s.mu.Unlock()
	for _, a := range ackers {
		a.close() // settled deliveries are acked, not redelivered
	}
	_ = s.conn.Close()
	s.pub.wait()
}

func connErr(err *amqp.Error) error {
	if err == nil {
		return errors.New("connection closed")
	}
	return err
}
