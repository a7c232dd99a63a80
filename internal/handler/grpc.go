package handler

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/budget"
	"handoff.dev/handoff/internal/redact"
)

// Metadata keys every gRPC call carries beside the request's own fields, so
// that interceptors (tracing, logging) see them without reading the message.
const (
	MetadataAttempt     = "handoff-attempt"
	MetadataDeadline    = "handoff-deadline"
	MetadataRedelivered = "handoff-redelivered"
	MetadataReplayID    = "handoff-replay-id"
)

// traceHeaders are the W3C trace context headers passed on as metadata.
var traceHeaders = [...]string{"traceparent", "tracestate"}

// GRPCOptions configures a gRPC client.
type GRPCOptions struct {
	// URL is grpc://host:port, grpcs://host:port (TLS, system roots) or
	// grpc+unix:///path/app.sock.
	URL string
	// Classifier maps the app's status codes (Classifier.WithGRPC).
	Classifier *Classifier
}

// GRPC delivers messages with handoff.handler.v1.MessageHandler. It is safe
// for concurrent use. One HTTP/2 connection carries every call in flight:
// the app's server must allow handler.max_concurrency concurrent streams
// (grpc-go, grpc-java and most servers allow far more by default); a call
// that finds them all taken waits for one and, if its timeout ends first,
// counts as overload.
type GRPC struct {
	conn          *grpc.ClientConn
	client        handlerv1.MessageHandlerClient
	network, addr string // for Probe
	classifier    *Classifier
	now           func() time.Time
	// single is set once the app answered HandleBatch with UNIMPLEMENTED:
	// batches go as one Handle call per message from then on.
	single atomic.Bool
}

// maxGRPCMessage bounds an answer the sidecar reads, as maxBatchResponse
// does for HTTP.
const maxGRPCMessage = maxBatchResponse

// NewGRPC returns a client for the app at o.URL. It does not connect: the
// first call does, and a call while the app is down fails at once
// (fail-fast) as Unreachable.
func NewGRPC(o GRPCOptions) (*GRPC, error) {
	tg, err := ParseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("handler url: %w", err)
	}
	if tg.Transport != TransportGRPC {
		return nil, fmt.Errorf("handler url: %s is not a gRPC handler", redact.URL(o.URL))
	}
	target := "passthrough:///" + tg.Addr
	if tg.Network == "unix" {
		target = "unix://" + tg.Addr
	}
	creds := insecure.NewCredentials()
	if tg.TLS {
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(creds),
		grpc.WithNoProxy(), // the app is local; never route it through a proxy
		grpc.WithStatsHandler(reachStats{}),
		// Reconnect soon after the app comes back; Probe also cuts a
		// backoff short once the app accepts connections again.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxGRPCMessage)),
		grpc.WithUserAgent("handoff"),
	)
	if err != nil {
		return nil, fmt.Errorf("handler url: %w", err)
	}
	return &GRPC{conn: conn, client: handlerv1.NewMessageHandlerClient(conn), network: tg.Network, addr: tg.Addr,
		classifier: o.Classifier, now: time.Now}, nil
}

// Close closes the connection; calls in flight end with an error.
func (g *GRPC) Close() { _ = g.conn.Close() }

// Probe reports whether the app accepts connections and the gRPC
// connection to it is up. A connection waiting out its backoff after the
// app went down is tried again at once: calls fail fast until it is up, so
// Probe returns only once they can reach the app.
func (g *GRPC) Probe(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, g.network, g.addr)
	if err != nil {
		return err
	}
	_ = conn.Close()
	reset := false
	for {
		s := g.conn.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			g.conn.Connect()
		case connectivity.TransientFailure:
			if reset {
				return errors.New("the app accepts connections, but a gRPC connection to it failed")
			}
			reset = true
			g.conn.ResetConnectBackoff()
		}
		if !g.conn.WaitForStateChange(ctx, s) {
			return fmt.Errorf("the app accepts connections, but no gRPC connection to it is up yet: %w", ctx.Err())
		}
	}
}

// Deliver makes one attempt with Handle. The attempt's timeout is the call's
// deadline. It never returns an error: every way a call can end is an
// outcome.
func (g *GRPC) Deliver(ctx context.Context, r *Request) Result {
	start := g.now()
	ctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	ctx = metadata.NewOutgoingContext(ctx, attemptMetadata(r))
	ctx, tr := traceReach(ctx)
	resp, err := g.client.Handle(ctx, grpcRequest(r))
	end := g.now()
	o, after := g.classifier.GRPC(resp.GetOutcome(), resp.GetRetryAfter().AsDuration(), err, tr.get(), g.connected())
	res := Result{Outcome: o, RetryAfter: after, Latency: end.Sub(start)}
	if o != budget.Success {
		res.Detail = grpcDetail(resp.GetOutcome(), resp.GetDetail(), err)
	}
	return res
}

func (g *GRPC) connected() bool { return g.conn.GetState() == connectivity.Ready }

// grpcDetail is the evidence kept for a failed call: the app's verdict and
// detail, or the status.
func grpcDetail(o handlerv1.Outcome, detail string, err error) string {
	var s string
	if err != nil {
		st := status.Convert(err)
		s = "gRPC " + CodeName(st.Code())
		if m := st.Message(); m != "" {
			s += ": " + m
		}
	} else {
		s = strings.TrimPrefix(o.String(), "OUTCOME_")
		if detail != "" {
			s += ": " + detail
		}
	}
	if len(s) > evidenceLen {
		s = s[:evidenceLen]
	}
	return s
}

// CodeName spells a code as the proto does (DEADLINE_EXCEEDED, not
// DeadlineExceeded).
func CodeName(code codes.Code) string {
	var b strings.Builder
	for i, c := range code.String() {
		if i > 0 && c >= 'A' && c <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(c)
	}
	return strings.ToUpper(b.String())
}

// grpcRequest builds the request from what the HTTP headers carry: the
// CloudEvents attributes read by ceAttributes (the same reading as both
// HTTP content modes), the message's other headers, and the attempt's
// fields.
func grpcRequest(r *Request) *handlerv1.HandleRequest {
	m := r.Message
	ev := &handlerv1.CloudEvent{Id: text(r.EventID), SpecVersion: SpecVersion}
	var headers, ext map[string]string
	// Two spellings of one attribute (ce-x and ce_x): the smaller value, so
	// every attempt sends the same.
	keep := func(m map[string]string, k, v string) map[string]string {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return m // a protobuf string must be UTF-8: left out, as HTTP leaves out what it cannot send
		}
		if m == nil {
			m = map[string]string{}
		}
		if old, ok := m[k]; !ok || v < old {
			m[k] = v
		}
		return m
	}
	ev.Source, ev.Type, ev.DataContentType = ceAttributes(r, func(attr, v string) {
		switch attr {
		case "subject":
			if v = text(v); ev.Subject == "" || v < ev.Subject {
				ev.Subject = v
			}
			return
		case "time":
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				ev.Time = timestamppb.New(t)
				return
			}
		}
		ext = keep(ext, attr, v)
	}, func(k, v string) {
		headers = keep(headers, k, v)
	})
	ev.Source, ev.Type, ev.DataContentType = text(ev.Source), text(ev.Type), text(ev.DataContentType)
	req := &handlerv1.HandleRequest{
		Event:       ev,
		Body:        m.Data(),
		Headers:     headers,
		Attempt:     int32(min(r.Attempt, 1<<31-1)),
		Redelivered: r.Redelivered,
		ReplayId:    text(r.ReplayID),
		Origin:      text(r.Origin),
	}
	ev.Extensions = ext
	if !r.FirstAttemptAt.IsZero() {
		req.FirstAttemptAt = timestamppb.New(r.FirstAttemptAt)
	}
	if !r.Deadline.IsZero() {
		req.Deadline = timestamppb.New(r.Deadline)
	}
	return req
}

// text makes s a valid protobuf string: a message that fails to marshal
// would never reach the app, and every attempt of it would fail the same.
// An AMQP message id is bytes; the rare one that is not UTF-8 reaches the
// app with U+FFFD in place of its bad bytes (and a batch matches the app's
// answer on that spelling).
func text(s string) string { return wireID(s) }

// attemptMetadata is the call's metadata: the attempt's fields and the
// message's trace context.
func attemptMetadata(r *Request) metadata.MD {
	md := make(metadata.MD, 6)
	md[MetadataAttempt] = []string{strconv.Itoa(r.Attempt)}
	if !r.Deadline.IsZero() {
		md[MetadataDeadline] = []string{r.Deadline.UTC().Format(broker.TimeLayout)}
	}
	md[MetadataRedelivered] = []string{strconv.FormatBool(r.Redelivered)}
	if r.ReplayID != "" && metadataValue(r.ReplayID) {
		md[MetadataReplayID] = []string{r.ReplayID}
	}
	for k, v := range r.Message.Headers {
		for _, name := range traceHeaders {
			if strings.EqualFold(k, name) && metadataValue(v) {
				md[name] = []string{v}
			}
		}
	}
	if r.TraceParent != "" && metadataValue(r.TraceParent) {
		// The attempt's span replaces the message's context.
		md["traceparent"] = []string{r.TraceParent}
		delete(md, "tracestate")
		if r.TraceState != "" && metadataValue(r.TraceState) {
			md["tracestate"] = []string{r.TraceState}
		}
	}
	return md
}

// metadataValue reports whether v can be sent as a metadata value:
// printable ASCII. grpc-go refuses a call with anything else before it
// leaves, which would look like an app that is down; the request's fields
// carry the value anyway.
func metadataValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] < ' ' || v[i] > '~' {
			return false
		}
	}
	return true
}

// reachKey carries a call's reach trace in its context, for reachStats.
type reachKey struct{}

// reachTrace records how far one call got (callReach), raised by reachStats
// from the transport's own events.
type reachTrace struct{ v atomic.Uint32 }

func traceReach(ctx context.Context) (context.Context, *reachTrace) {
	tr := &reachTrace{}
	return context.WithValue(ctx, reachKey{}, tr), tr
}

func (t *reachTrace) raise(r callReach) {
	for {
		old := t.v.Load()
		if uint32(r) <= old || t.v.CompareAndSwap(old, uint32(r)) {
			return
		}
	}
}

func (t *reachTrace) get() callReach { return callReach(t.v.Load()) }

// reachStats tells a status the app sent from one the transport made up,
// which a status alone cannot: both can be UNAVAILABLE. grpc-go reports
// OutHeader once the call's headers are queued on a connection (so a call
// without it never left the sidecar), and InTrailer only when a gRPC
// answer's final headers arrive (so a call with it was answered by the
// server, status and all).
type reachStats struct{}

func (reachStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (reachStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	tr, _ := ctx.Value(reachKey{}).(*reachTrace)
	if tr == nil {
		return
	}
	switch s.(type) {
	case *stats.OutHeader:
		tr.raise(sent)
	case *stats.InTrailer:
		tr.raise(answered)
	}
}

func (reachStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (reachStats) HandleConn(context.Context, stats.ConnStats) {}
