package handler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

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
	// target is the request URL, parsed once and shared by every call: it
	// is only read, by the transport as by this client.
	target        *url.URL
	network, addr string // tcp host:port or unix path, for Probe
	// tr makes the calls. Not through an http.Client: a redirect is the
	// app's answer, classified like any other (3xx is permanent by default),
	// and following it would turn the POST into a GET elsewhere and ack a
	// message the app never saw; and Client.Do copies every request's
	// headers in case it has to follow one.
	tr         *http.Transport
	user       *url.Userinfo // from the URL, sent as basic auth
	classifier *Classifier
	now        func() time.Time
}

// evidenceLen bounds how much of a failed response body is kept.
const evidenceLen = 256

// drainLimit is how much of a response body is read so its connection can be
// reused; a longer body costs a new connection instead.
const drainLimit = 64 << 10

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
	n := max(o.MaxConcurrency, 1)
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	dial := dialer.DialContext
	if tg.Network == "unix" {
		// Every request goes to the socket, whatever its URL says; the URL
		// keeps only the request's path, under a placeholder host.
		target = "http://localhost" + tg.Path
		dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", tg.Addr)
		}
	}
	// Parsed and normalized as http.NewRequest does on every call.
	tmpl, err := http.NewRequest(http.MethodPost, target, nil)
	if err != nil {
		return nil, fmt.Errorf("handler url: %w", redact.Error(err))
	}
	tr := &http.Transport{
		Proxy: nil, // the app is local; never route it through a proxy
		// Of an answer the sidecar reads at most the evidence and drains
		// the rest: asking for gzip would only add a header to every call,
		// a header map the transport makes for it, and work for the app.
		DisableCompression:  true,
		DialContext:         dial,
		MaxIdleConns:        n,
		MaxIdleConnsPerHost: n,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 5 * time.Second,
	}
	return &HTTP{target: tmpl.URL, network: tg.Network, addr: tg.Addr, tr: tr, user: u.User, classifier: o.Classifier, now: time.Now}, nil
}

// Close releases idle connections.
func (h *HTTP) Close() { h.tr.CloseIdleConnections() }

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
	ctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	hdr := make(http.Header, headerCap(r)+h.authCap()) // never grown
	setHeaders(hdr, r)
	req := h.newRequest(ctx, r.Message.Data(), hdr)
	h.authorize(req)
	resp, err := h.tr.RoundTrip(req)
	if err != nil {
		return Result{Outcome: transportOutcome(err), Detail: errorDetail(err), Latency: h.now().Sub(start)}
	}
	var evidence []byte
	if resp.Body != http.NoBody {
		// An answer with no body (Content-Length: 0) has already given its
		// connection back; any other must be read to its end first.
		if resp.StatusCode/100 != 2 {
			evidence, _ = io.ReadAll(io.LimitReader(resp.Body, evidenceLen))
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	}
	_ = resp.Body.Close()
	end := h.now()
	o, after := h.classifier.Response(resp.StatusCode, resp.Header, end)
	res := Result{Outcome: o, Status: resp.StatusCode, RetryAfter: after, Latency: end.Sub(start)}
	if o != budget.Success {
		res.Detail = "HTTP " + strconv.Itoa(resp.StatusCode)
		if len(evidence) > 0 {
			res.Detail += ": " + strings.TrimSpace(string(evidence))
		}
	}
	return res
}

// newRequest is http.NewRequestWithContext(ctx, POST, target, body) with
// header, less what that repeats on every call: parsing the URL and making
// a header map to be replaced. The body stays an io.NopCloser of a
// *bytes.Reader, which the transport knows is in memory: it sends
// Content-Length and writes the head and body together, and GetBody lets it
// send the request again on a new connection when a pooled one turns out to
// be closed before anything was written.
func (h *HTTP) newRequest(ctx context.Context, body []byte, header http.Header) *http.Request {
	req := &http.Request{
		Method:     http.MethodPost,
		URL:        h.target,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     header,
		Host:       h.target.Host,
	}
	if len(body) == 0 {
		req.Body = http.NoBody
		req.GetBody = noBody
	} else {
		req.ContentLength = int64(len(body))
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	return req.WithContext(ctx)
}

func noBody() (io.ReadCloser, error) { return http.NoBody, nil }

// authCap is how many headers authorize may add.
func (h *HTTP) authCap() int {
	if h.user == nil {
		return 0
	}
	return 1
}

// authorize sends the URL's user and password as basic auth, as http.Client
// would, unless the request carries its own Authorization.
func (h *HTTP) authorize(req *http.Request) {
	if h.user == nil || req.Header.Get("Authorization") != "" {
		return
	}
	pass, _ := h.user.Password()
	req.SetBasicAuth(h.user.Username(), pass)
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
