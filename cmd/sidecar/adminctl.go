package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/admin"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/report"
)

// adminFlags are the flags of the commands that ask a running sidecar.
type adminFlags struct {
	addr, tokenFile, config, output string
	timeout                         time.Duration
	cmd                             *cobra.Command
	// tokenFrom says where the token came from, for an error about it; ""
	// when there is none.
	tokenFrom string
}

// defaultAdmin is admin.listen's default.
const defaultAdmin = "127.0.0.1:9400"

func (f *adminFlags) add(cmd *cobra.Command) {
	f.cmd = cmd
	cmd.Flags().StringVar(&f.addr, "admin", "", "the sidecar's admin API address (default: --config's admin.listen, else $HANDOFF_ADMIN_ADDR or $HANDOFF_ADMIN_LISTEN, else "+defaultAdmin+")")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", "", "file holding the admin API's bearer token (default: --config's admin token, else $HANDOFF_ADMIN_TOKEN or $HANDOFF_ADMIN_TOKEN_FILE)")
	cmd.Flags().StringVarP(&f.config, "config", "c", "", "the sidecar's config file: its admin.listen and admin token are used")
	cmd.Flags().StringVarP(&f.output, "output", "o", "text", "text or json")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "how long to wait for the answer")
}

// call dials the admin API and runs fn with a client, bounded by --timeout.
func (f *adminFlags) call(ctx context.Context, fn func(context.Context, adminv1.AdminClient) (proto.Message, error)) (proto.Message, error) {
	c, done, err := f.client()
	if err != nil {
		return nil, err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	return fn(ctx, c)
}

// maxAnswer bounds an answer the CLI takes: a dead letter's body (1 MiB at
// most) with its history, whose approvals may each carry a repaired body.
const maxAnswer = 32 << 20

// client dials the admin API; done closes the connection. The connection
// is plain h2c, as the admin listener serves it. Each call bounds its own
// wait (--timeout).
func (f *adminFlags) client() (c adminv1.AdminClient, done func(), err error) {
	if f.output != "text" && f.output != "json" {
		return nil, nil, &exitError{code: exitConfig, err: fmt.Errorf("--output: want text or json, got %q", f.output)}
	}
	tok, err := f.resolve()
	if err != nil {
		return nil, nil, err
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxAnswer)),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return f.explain(invoker(ctx, method, req, reply, cc, opts...))
		})}
	if tok != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(tok)))
	}
	conn, err := grpc.NewClient("passthrough:///"+f.addr, opts...)
	if err != nil {
		return nil, nil, err
	}
	return adminv1.NewAdminClient(conn), func() { _ = conn.Close() }, nil
}

// resolve settles the address and the token: a flag given wins, then the
// config file's admin block (with its HANDOFF_* overrides), then the
// environment a sidecar container has, then the default address and no
// token.
func (f *adminFlags) resolve() ([]byte, error) {
	changed := func(name string) bool { return f.cmd != nil && f.cmd.Flags().Changed(name) }
	var cfgAdmin *config.Admin
	if f.config != "" {
		cfg, err := loadConfig(f.config)
		if err != nil {
			return nil, err
		}
		cfgAdmin = &cfg.Admin
	}
	if !changed("admin") {
		switch {
		case cfgAdmin != nil:
			f.addr = dialable(cfgAdmin.Listen)
		case os.Getenv("HANDOFF_ADMIN_ADDR") != "":
			f.addr = os.Getenv("HANDOFF_ADMIN_ADDR")
		case os.Getenv("HANDOFF_ADMIN_LISTEN") != "":
			f.addr = dialable(os.Getenv("HANDOFF_ADMIN_LISTEN"))
		default:
			f.addr = defaultAdmin
		}
	}
	// from names where the token came from, for an error about it.
	readFile := func(path, from string) ([]byte, error) {
		tok, err := admin.ReadToken(path)
		if err != nil {
			return nil, &exitError{code: exitConfig, err: fmt.Errorf("%s: %w", from, err)}
		}
		f.tokenFrom = from
		return tok, nil
	}
	switch {
	case changed("token-file"):
		return readFile(f.tokenFile, "--token-file "+f.tokenFile)
	case cfgAdmin != nil && cfgAdmin.Token != "":
		f.tokenFrom = "$HANDOFF_ADMIN_TOKEN (which overrides --config's admin.token_file)"
		return []byte(cfgAdmin.Token), nil
	case cfgAdmin != nil && cfgAdmin.TokenFile != "":
		return readFile(cfgAdmin.TokenFile, cfgAdmin.TokenFile+" (--config's admin.token_file)")
	case cfgAdmin != nil:
		return nil, nil
	case os.Getenv("HANDOFF_ADMIN_TOKEN") != "":
		f.tokenFrom = "$HANDOFF_ADMIN_TOKEN"
		return []byte(strings.TrimSpace(os.Getenv("HANDOFF_ADMIN_TOKEN"))), nil
	case os.Getenv("HANDOFF_ADMIN_TOKEN_FILE") != "":
		path := os.Getenv("HANDOFF_ADMIN_TOKEN_FILE")
		return readFile(path, path+" ($HANDOFF_ADMIN_TOKEN_FILE)")
	}
	return nil, nil
}

// dialable is where a client reaches a listener bound to addr: a listener
// on every interface (":9400", "0.0.0.0:9400") is reached on loopback.
func dialable(addr string) string {
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
func (f *adminFlags) explain(err error) error {
	st, ok := grpcstatus.FromError(err)
	if !ok {
		return err
	}
	var msg string
	switch st.Code() {
	case codes.Unauthenticated:
		if f.tokenFrom == "" {
			msg = fmt.Sprintf("the admin API at %s wants a token, and none was given: pass --token-file FILE or --config FILE (the sidecar's), or set HANDOFF_ADMIN_TOKEN", f.addr)
		} else {
			msg = fmt.Sprintf("the admin API at %s refused the token from %s: check that it is the token the sidecar reads, from its admin.token_file", f.addr, f.tokenFrom)
		}
	case codes.Unavailable:
		msg = fmt.Sprintf("no admin API answers at %s: check that the sidecar is running, that its admin API is on (admin.token_file set) and that admin.listen is this address (--admin ADDR or --config FILE say where to ask); %s", f.addr, st.Message())
	case codes.DeadlineExceeded:
		msg = fmt.Sprintf("no answer from the admin API at %s within --timeout %v", f.addr, f.timeout)
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

// writeJSON writes m as the REST API answers it.
func writeJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func statusCmd() *cobra.Command {
	var f adminFlags
	cmd := &cobra.Command{
		Use: "status [--admin ADDR] [--token-file FILE]",
		Example: `  sidecar status --config /etc/handoff/handoff.yaml
  sidecar status --admin 127.0.0.1:9400 --token-file /etc/handoff/admin.token -o json`,
		Short: "Show what a running sidecar is doing: sources, calls, retry budget, journal",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := f.call(cmd.Context(), func(ctx context.Context, c adminv1.AdminClient) (proto.Message, error) {
				return c.GetStatus(ctx, &adminv1.GetStatusRequest{})
			})
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), m)
			}
			report.Status(cmd.OutOrStdout(), m.(*adminv1.Status), time.Now())
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

func eventsCmd() *cobra.Command {
	var f adminFlags
	cmd := &cobra.Command{
		Use: "events SOURCE EVENT_ID [--admin ADDR] [--token-file FILE]",
		Example: `  sidecar events orders order-1 --config /etc/handoff/handoff.yaml
  sidecar events payments 'kafka:payments/0/42' -o json`,
		Short: "Print an event's hand-offs from a running sidecar's journal, each with its timeline",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := f.call(cmd.Context(), func(ctx context.Context, c adminv1.AdminClient) (proto.Message, error) {
				return c.GetEvent(ctx, &adminv1.GetEventRequest{Source: args[0], EventId: args[1]})
			})
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), m)
			}
			report.Event(cmd.OutOrStdout(), m.(*adminv1.Event))
			return nil
		},
	}
	f.add(cmd)
	return cmd
}
