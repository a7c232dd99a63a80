package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/admin"
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
			writeStatus(cmd.OutOrStdout(), m.(*adminv1.Status), time.Now())
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
			writeEvent(cmd.OutOrStdout(), m.(*adminv1.Event))
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

// writeEvent prints an event's timelines as `sidecar journal events` does.
func writeEvent(w io.Writer, e *adminv1.Event) {
	for _, h := range e.GetHandoffs() {
		key := e.GetSource() + "/" + e.GetEventId()
		if h.GetReplayId() != "" {
			key += "@" + h.GetReplayId()
		}
		fmt.Fprintln(w, key)
		for _, s := range h.GetSteps() {
			fmt.Fprintf(w, "  %s  %s\n", s.GetAt().AsTime().UTC().Format(stampLayout), s.GetText())
		}
	}
}

// writeStatus prints a status for a reader; now dates its ages.
func writeStatus(w io.Writer, s *adminv1.Status, now time.Time) {
	if s.GetStartedAt() != nil {
		at := s.GetStartedAt().AsTime()
		fmt.Fprintf(w, "started   %s (up %s)\n", at.UTC().Format(time.RFC3339), now.Sub(at).Round(time.Second))
	}
	if s.GetNotReady() != "" {
		fmt.Fprintf(w, "ready     no: %s\n", s.GetNotReady())
	} else {
		fmt.Fprintln(w, "ready     yes")
	}
	c := s.GetCalls()
	fmt.Fprintf(w, "calls     %d in flight, limit %d of %d, %d queued\n", c.GetInFlight(), c.GetLimit(), c.GetMax(), c.GetQueued())
	if c.GetFreshIntakePaused() {
		fmt.Fprintln(w, "          fresh intake paused: the retry budget is spent and first attempts keep failing")
	}
	if c.GetAppUnreachable() {
		fmt.Fprintln(w, "          app unreachable: every call waits for it")
	}
	if u := c.GetOverloadUntil(); u != nil {
		fmt.Fprintf(w, "          the app asked to slow down: calls wait until %s\n", u.AsTime().UTC().Format(time.RFC3339))
	}
	b := s.GetBudget()
	fmt.Fprintf(w, "budget    %.2f tokens, %d re-attempts denied\n", b.GetTokens(), b.GetDenied())
	j := s.GetJournal()
	fmt.Fprintf(w, "journal   %s, %s, %d open, commit p50 %s max %s\n", j.GetPath(), byteSize(j.GetSizeBytes()), j.GetOpen(),
		j.GetCommitP50().AsDuration().Round(time.Microsecond), j.GetCommitMax().AsDuration().Round(time.Microsecond))
	for _, src := range s.GetSources() {
		fmt.Fprintf(w, "\nsource %s (%s %s)\n", src.GetName(), src.GetBroker(), src.GetFrom())
		line := src.GetState()
		if src.GetReason() != "" {
			line += ": " + src.GetReason() // says so when not connected
		}
		if src.GetConnected() {
			line = "connected, " + line
		}
		fmt.Fprintf(w, "  %s\n", line)
		fmt.Fprintf(w, "  %d in flight", src.GetInFlight())
		if a := src.GetOldestUnsettledAge(); a != nil && src.GetInFlight() > 0 {
			fmt.Fprintf(w, ", oldest %s", a.AsDuration().Round(time.Millisecond))
		}
		fmt.Fprintln(w)
		for _, t := range src.GetRetryTiers() {
			waiting := "waiting unknown"
			if t.GetKnown() {
				waiting = fmt.Sprintf("%d waiting", t.GetWaiting())
			}
			fmt.Fprintf(w, "  retry %s (%s): %s\n", t.GetName(), t.GetDelay().AsDuration(), waiting)
		}
		if b := src.GetBacklog(); b != nil {
			drain := "not converging: arrivals outpace completions"
			switch {
			case b.GetMessages() == 0:
				drain = "nothing waiting"
			case b.GetConverging():
				drain = "drains in " + b.GetDrain().AsDuration().Round(time.Second).String()
			}
			fmt.Fprintf(w, "  backlog %d, arrivals %.1f/s, completions %.1f/s: %s\n",
				b.GetMessages(), b.GetArrivalRate(), b.GetCompletionRate(), drain)
		}
		if c := src.GetDeadLetters(); c != nil {
			fmt.Fprintf(w, "  dead letters %s\n", strings.TrimPrefix(countsLine(c), c.GetSource()+": "))
		}
	}
}

// byteSize is n bytes for a reader.
func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
