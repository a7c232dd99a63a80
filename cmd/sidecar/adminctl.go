package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/admin"
	"handoff.dev/handoff/internal/report"
)

// adminFlags are the flags of the commands that ask a running sidecar.
type adminFlags struct {
	addr, tokenFile, output string
	timeout                 time.Duration
}

func (f *adminFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.addr, "admin", "127.0.0.1:9400", "the sidecar's admin API address (admin.listen)")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", "", "file holding the admin API's bearer token (admin.token_file)")
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
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxAnswer))}
	if f.tokenFile != "" {
		tok, err := admin.ReadToken(f.tokenFile)
		if err != nil {
			return nil, nil, &exitError{code: exitConfig, err: fmt.Errorf("--token-file: %w", err)}
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(tok)))
	}
	conn, err := grpc.NewClient("passthrough:///"+f.addr, opts...)
	if err != nil {
		return nil, nil, err
	}
	return adminv1.NewAdminClient(conn), func() { _ = conn.Close() }, nil
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
		Use:   "status [--admin ADDR] [--token-file FILE]",
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
		Use:   "events SOURCE EVENT_ID [--admin ADDR] [--token-file FILE]",
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
