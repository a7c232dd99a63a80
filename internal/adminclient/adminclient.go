// Package adminclient is the admin API's client as the commands use it:
// dialled with the token, its refusals worded as what to check, and a
// replay followed to its end.
package adminclient

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/admin"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/report"
)

// Target is where a command asks, and with what.
type Target struct {
	Addr  string
	Token []byte
	// TokenFrom says where the token came from, for an error about it; ""
	// when there is none.
	TokenFrom string
	// Timeout bounds each call.
	Timeout time.Duration
}

// Dial connects to t's admin API (plain h2c, as the admin listener serves
// it); done closes the connection. Each call's refusal or failure to reach
// the API is worded by explain.
func Dial(t Target) (c adminv1.AdminClient, done func(), err error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxAnswer)),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return t.explain(invoker(ctx, method, req, reply, cc, opts...))
		})}
	if t.Token != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(t.Token)))
	}
	conn, err := grpc.NewClient("passthrough:///"+t.Addr, opts...)
	if err != nil {
		return nil, nil, err
	}
	return adminv1.NewAdminClient(conn), func() { _ = conn.Close() }, nil
}

// maxAnswer bounds an answer the CLI takes: a dead letter's body (1 MiB at
// most) with its history, whose approvals may each carry a repaired body.
const maxAnswer = 32 << 20

// Dialable is where a client reaches a listener bound to addr: a listener
// on every interface (":9400", "0.0.0.0:9400") is reached on loopback.
func Dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

// explain words a refusal or an unreachable API as what to check, keeping
// its code (a command may act on it).
func (t Target) explain(err error) error {
	st, ok := grpcstatus.FromError(err)
	if !ok {
		return err
	}
	var msg string
	switch st.Code() {
	case codes.Unauthenticated:
		if t.TokenFrom == "" {
			msg = fmt.Sprintf("the admin API at %s wants a token, and none was given: pass --token-file FILE or --config FILE (the sidecar's), or set HANDOFF_ADMIN_TOKEN", t.Addr)
		} else {
			msg = fmt.Sprintf("the admin API at %s refused the token from %s: check that it is the token the sidecar reads, from its admin.token_file", t.Addr, t.TokenFrom)
		}
	case codes.Unavailable:
		msg = fmt.Sprintf("no admin API answers at %s: check that the sidecar is running, that its admin API is on (admin.token_file set) and that admin.listen is this address (--admin ADDR or --config FILE say where to ask); %s", t.Addr, st.Message())
	case codes.DeadlineExceeded:
		msg = fmt.Sprintf("no answer from the admin API at %s within --timeout %v", t.Addr, t.Timeout)
	default:
		return err
	}
	return grpcstatus.Error(st.Code(), msg)
}

// bearer sends the token with every call. The admin listener has no TLS:
// the token may travel in clear, to loopback.
type bearer []byte

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// FollowEvery is how often --follow asks for a replay's progress.
var FollowEvery = 500 * time.Millisecond

// Follow asks for a replay's progress every FollowEvery, drawing it on
// bar (stderr: a bar on a terminal, a line every few seconds otherwise),
// until the replay ends and its published copies' outcomes are known, or
// OutcomesWait after it ended; it returns the replay as it was last read.
// Cancelling ctx stops following, not the replay.
func Follow(ctx context.Context, c adminv1.AdminClient, timeout time.Duration, id string, bar io.Writer, terminal bool) (*adminv1.Replay, error) {
	var (
		pb       *progressbar.ProgressBar
		lastLine time.Time
		ended    time.Time
		first    *followPoint // the first publish seen, for a rate before the sidecar has one
	)
	defer func() {
		if pb != nil {
			_ = pb.Exit()
			fmt.Fprintln(bar)
		}
	}()
	tick := time.NewTicker(FollowEvery)
	defer tick.Stop()
	for {
		actx, cancel := context.WithTimeout(ctx, timeout)
		r, err := c.GetReplay(actx, &adminv1.GetReplayRequest{Id: id})
		cancel()
		if err != nil {
			return nil, err
		}
		p := r.GetProgress()
		now := time.Now()
		if first == nil && p.GetPublished() > 0 {
			first = &followPoint{at: now, published: p.GetPublished()}
		}
		if p.GetRate() == 0 && first != nil && now.Sub(first.at) > time.Second {
			// The sidecar's rate is over its last seconds of publishing,
			// and says 0 until it has them.
			r = proto.Clone(r).(*adminv1.Replay)
			r.Progress.Rate = float64(p.GetPublished()-first.published) / now.Sub(first.at).Seconds()
		}
		switch {
		case terminal && pb == nil && p.GetSelected() > 0:
			pb = progressbar.NewOptions64(p.GetSelected(),
				progressbar.OptionSetWriter(bar),
				progressbar.OptionSetWidth(30),
				progressbar.OptionShowCount(),
				progressbar.OptionSetPredictTime(false), // the sidecar's ETA, at the run's rate, is shown instead
				progressbar.OptionSetDescription("replay "+report.Shown(id)),
			)
		case !terminal && now.Sub(lastLine) >= followLineEvery:
			progressLine(bar, r)
			lastLine = now
		}
		if pb != nil {
			pb.Describe(report.Progress(r))
			_ = pb.Set64(p.GetPublished())
		}
		if r.GetState() != string(deadletter.RunRunning) {
			if ended.IsZero() {
				ended = now
			}
			// Ended: its copies are published; their outcomes come as
			// the app answers them.
			if report.Pending(r) == 0 || now.Sub(ended) >= OutcomesWait {
				if !terminal && lastLine != now {
					progressLine(bar, r) // the last word, whenever the one before was
				}
				return r, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stopped following replay %s, which goes on (sidecar replay status %s --follow): %w", id, id, ctx.Err())
		case <-tick.C:
		}
	}
}

// progressLine is the progress as a line, where no bar can be drawn.
func progressLine(w io.Writer, r *adminv1.Replay) {
	p := r.GetProgress()
	fmt.Fprintf(w, "%s: published %d of %d, handled %d, failed %d\n", report.Progress(r), p.GetPublished(), p.GetSelected(), p.GetHandled(), p.GetFailed())
}

// followPoint is a replay's published count when it was read.
type followPoint struct {
	at        time.Time
	published int64
}

// followLineEvery spaces the progress lines written where no bar can be
// drawn (standard error not a terminal).
const followLineEvery = 5 * time.Second

// OutcomesWait bounds how long --follow waits, after a replay ended, for
// its published copies' outcomes; the summary says how many it did not see.
var OutcomesWait = 30 * time.Second

// DefaultAddr is admin.listen's default.
const DefaultAddr = "127.0.0.1:9400"

// Given is what a command was given to find the admin API by.
type Given struct {
	// Addr and TokenFile are the flags, "" when not given.
	Addr, TokenFile string
	// Config is the admin block of --config (with its HANDOFF_*
	// overrides); nil without --config.
	Config *config.Admin
	Getenv func(string) string
}

// Resolve settles the address and the token: a flag given wins, then the
// config's admin block, then the environment a sidecar container has
// (HANDOFF_ADMIN_ADDR or _LISTEN, HANDOFF_ADMIN_TOKEN or _TOKEN_FILE), then
// the default address and no token.
func Resolve(g Given) (Target, error) {
	var t Target
	switch {
	case g.Addr != "":
		t.Addr = g.Addr
	case g.Config != nil:
		t.Addr = Dialable(g.Config.Listen)
	case g.Getenv("HANDOFF_ADMIN_ADDR") != "":
		t.Addr = g.Getenv("HANDOFF_ADMIN_ADDR")
	case g.Getenv("HANDOFF_ADMIN_LISTEN") != "":
		t.Addr = Dialable(g.Getenv("HANDOFF_ADMIN_LISTEN"))
	default:
		t.Addr = DefaultAddr
	}
	// from names where the token came from, for an error about it.
	readFile := func(path, from string) (Target, error) {
		tok, err := admin.ReadToken(path)
		if err != nil {
			return t, fmt.Errorf("%s: %w", from, err)
		}
		t.Token, t.TokenFrom = tok, from
		return t, nil
	}
	switch {
	case g.TokenFile != "":
		return readFile(g.TokenFile, "--token-file "+g.TokenFile)
	case g.Config != nil && g.Config.Token != "":
		t.Token, t.TokenFrom = []byte(g.Config.Token), "$HANDOFF_ADMIN_TOKEN (which overrides --config's admin.token_file)"
	case g.Config != nil && g.Config.TokenFile != "":
		return readFile(g.Config.TokenFile, g.Config.TokenFile+" (--config's admin.token_file)")
	case g.Config != nil:
	case g.Getenv("HANDOFF_ADMIN_TOKEN") != "":
		t.Token, t.TokenFrom = []byte(strings.TrimSpace(g.Getenv("HANDOFF_ADMIN_TOKEN"))), "$HANDOFF_ADMIN_TOKEN"
	case g.Getenv("HANDOFF_ADMIN_TOKEN_FILE") != "":
		path := g.Getenv("HANDOFF_ADMIN_TOKEN_FILE")
		return readFile(path, path+" ($HANDOFF_ADMIN_TOKEN_FILE)")
	}
	return t, nil
}
