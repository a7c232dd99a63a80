package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/adminclient"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/report"
)

// adminFlags are the flags of the commands that ask a running sidecar.
type adminFlags struct {
	addr, tokenFile, config, output string
	timeout                         time.Duration
	cmd                             *cobra.Command
}

func (f *adminFlags) add(cmd *cobra.Command) {
	f.cmd = cmd
	cmd.Flags().StringVar(&f.addr, "admin", "", "the sidecar's admin API address (default: --config's admin.listen, else $HANDOFF_ADMIN_ADDR or $HANDOFF_ADMIN_LISTEN, else "+adminclient.DefaultAddr+")")
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

// client dials the admin API; done closes the connection. Each call bounds
// its own wait (--timeout).
func (f *adminFlags) client() (c adminv1.AdminClient, done func(), err error) {
	if f.output != "text" && f.output != "json" {
		return nil, nil, &exitError{code: exitConfig, err: fmt.Errorf("--output: want text or json, got %q", f.output)}
	}
	t, err := f.resolve()
	if err != nil {
		return nil, nil, err
	}
	t.Timeout = f.timeout
	return adminclient.Dial(t)
}

// resolve settles the address and the token (adminclient.Resolve), from
// the flags given, --config and the environment.
func (f *adminFlags) resolve() (adminclient.Target, error) {
	changed := func(name string) bool { return f.cmd != nil && f.cmd.Flags().Changed(name) }
	var cfgAdmin *config.Admin
	if f.config != "" {
		cfg, err := loadConfig(f.config)
		if err != nil {
			return adminclient.Target{}, err
		}
		cfgAdmin = &cfg.Admin
	}
	in := adminclient.Given{Config: cfgAdmin, Getenv: os.Getenv}
	if changed("admin") {
		in.Addr = f.addr
	}
	if changed("token-file") {
		in.TokenFile = f.tokenFile
	}
	t, err := adminclient.Resolve(in)
	if err != nil {
		return t, &exitError{code: exitConfig, err: err}
	}
	return t, nil
}

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
