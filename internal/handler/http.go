package handler

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/redact"
)

// Request is one attempt to hand a message to the app.
type Request struct {
	Message *broker.Message
	EventID string
	// Source and Type become ce-source and ce-type when the message does not
	// carry its own.
	Source, Type string
	Attempt      int
	Deadline     time.Time
	// FirstAttemptAt is when the message's first attempt started, on any hop.
	FirstAttemptAt time.Time
	// Origin is where the message was first consumed: rabbitmq:<queue> or
	// kafka:<topic>/<partition>/<offset>.
	Origin string
	// Redelivered tells the app this event may have reached it before.
	Redelivered bool
	ReplayID    string
	// Timeout bounds this attempt.
	Timeout time.Duration
	// TraceParent and TraceState, when set, are the attempt's span context
	// (W3C trace context): sent to the app in place of the message's own.
	TraceParent, TraceState string
}

// Result is the app's answer, classified.
type Result struct {
	Outcome    budget.Outcome
	Status     int // 0 when there was no response
	RetryAfter time.Duration
	// Detail is the evidence kept with a failed message: the status and the
	// start of the response body, or the transport error.
	Detail  string
	Latency time.Duration
}

// HTTPOptions configures an HTTP client.
type HTTPOptions struct {
	URL string
	// MaxConcurrency sizes the connection pool: with fewer idle connections
	// than requests in flight, every surplus request dials a new one.
	MaxConcurrency int
	Classifier     *Classifier
}

// HTTP delivers messages with POST in CloudEvents binary content mode. It is
// safe for concurrent use.
type HTTP struct {
	// hc keeps the connections to the app (see call.go). A redirect is the
	// app's answer, classified like any other (3xx is permanent by
	// default): following it would turn the POST into a GET elsewhere and
	// ack a message the app never saw.
	hc *fasthttp.HostClient
	// head is every request's line and Host, made once.
	head          []byte
	network, addr string      // tcp host:port or unix path, for Probe
	auth          string      // the URL's user and password, as basic auth
	tls           *tls.Config // https: verified against the system roots
	classifier    *Classifier
	now           func() time.Time
	// The watch that breaks off calls when their context ends (watch.go).
	watchingState
}

// evidenceLen bounds how much of a failed response body is kept.
const evidenceLen = 256

// drainLimit is how much of a response body is read so its connection can be
// reused; a longer body costs a new connection instead.
const drainLimit = 64 << 10

// dialTimeout bounds a connection's set-up, within the call's own timeout.
const dialTimeout = 5 * time.Second

// NewHTTP returns a client for the app at o.URL: http://, https://, or
// http+unix:///path/app.sock (see ParseURL).
func NewHTTP(o HTTPOptions) (*HTTP, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("handler url: %w", redact.Error(err))
	}
	tg, err := ParseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("handler url: %w", err)
	}
	if tg.Transport != TransportHTTP {
		return nil, fmt.Errorf("handler url: %s is not an HTTP handler", redact.URL(o.URL))
	}
	target := o.URL
	if tg.Network == "unix" {
		// Every request goes to the socket, whatever its URL says; the URL
		// keeps only the request's path, under a placeholder host.
		target = "http://localhost" + tg.Path
	}
	// Parsed and normalized as http.NewRequest does.
	tmpl, err := http.NewRequest(http.MethodPost, target, nil)
	if err != nil {
		return nil, fmt.Errorf("handler url: %w", redact.Error(err))
	}
	h := &HTTP{network: tg.Network, addr: tg.Addr, classifier: o.Classifier, now: time.Now}
	h.head = fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: handoff\r\n", tmpl.URL.RequestURI(), tmpl.Host)
	if u.User != nil {
		pass, _ := u.User.Password()
		h.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pass))
	}
	if tg.TLS {
		h.tls = &tls.Config{ServerName: tmpl.URL.Hostname(), MinVersion: tls.VersionTLS12}
	}
	h.hc = &fasthttp.HostClient{
		Addr: tg.Addr,
		// Unbounded, as the concurrency limit bounds the calls: a call
		// never waits for a connection, it dials one.
		MaxConns:            math.MaxInt32,
		MaxIdleConnDuration: 90 * time.Second,
	}
	h.hc.DialTimeout = func(_ string, timeout time.Duration) (net.Conn, error) { return h.dial(timeout) }
	return h, nil
}

// dial connects to the app, and makes the TLS handshake for https.
func (h *HTTP) dial(timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), min(max(timeout, time.Millisecond), dialTimeout))
	defer cancel()
	d := &net.Dialer{KeepAlive: 30 * time.Second}
	if h.tls == nil {
		c, err := d.DialContext(ctx, h.network, h.addr)
		if err != nil {
			return nil, err
		}
		return newAnswerConn(c), nil
	}
	return (&tls.Dialer{NetDialer: d, Config: h.tls}).DialContext(ctx, h.network, h.addr)
}

// Close releases idle connections.
func (h *HTTP) Close() { h.hc.CloseIdleConnections() }

// Probe reports whether the app accepts connections.
func (h *HTTP) Probe(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, h.network, h.addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// Deliver makes one attempt. It never returns an error: every way a call can
// end is an outcome. The caller tells its own cancellation apart by its ctx.
func (h *HTTP) Deliver(ctx context.Context, r *Request) Result {
	start := h.now()
	c := getCallState()
	defer putCallState(c)
	appendHeaders(&c.header, r)
	a, err := h.post(ctx, r.Timeout, c.header, r.Message.Data(), 0, evidenceLen, c)
	end := h.now()
	if err != nil {
		return Result{Outcome: transportOutcome(err), Detail: errorDetail(err), Latency: end.Sub(start)}
	}
	o, after := h.classifier.Answer(a.status, a.outcome, a.retryAfter, end)
	res := Result{Outcome: o, Status: a.status, RetryAfter: after, Latency: end.Sub(start)}
	if o != budget.Success {
		res.Detail = "HTTP " + strconv.Itoa(a.status)
		if ev := strings.TrimSpace(string(a.body)); ev != "" {
			res.Detail += ": " + ev
		}
	}
	return res
}

// errorDetail is the evidence kept for a call that failed without an answer.
// It goes to the log, the journal and the handoff-error header of retry and
// DLQ copies, so it is redacted: an error that quotes the request's URL (a
// *url.Error) would carry the handler's password.
func errorDetail(err error) string { return redact.Error(err).Error() }

// transportOutcome classifies a failed call. Only a failure to connect proves
// the app never saw the request.
func transportOutcome(err error) budget.Outcome {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return budget.Unreachable
	}
	return budget.Unknown
}
