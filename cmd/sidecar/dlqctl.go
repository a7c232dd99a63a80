package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/report"
)

// usageError is a command line the CLI refuses before asking anything.
func usageError(format string, a ...any) error {
	return &exitError{code: exitConfig, err: fmt.Errorf(format, a...)}
}

// usageArgs makes a wrong count of arguments a refused command line.
func usageArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return &exitError{code: exitConfig, err: err}
		}
		return nil
	}
}

// refuseBadFlags makes a flag cobra cannot parse a refused command line
// (exit 2) for cmd and its subcommands.
func refuseBadFlags(cmd *cobra.Command) *cobra.Command {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &exitError{code: exitConfig, err: err} })
	return cmd
}

func dlqCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "dlq",
		Example: `  sidecar dlq list --state pending --since 1h
  sidecar dlq show orders.dlq/3
  sidecar dlq approve orders.dlq/3 --reason "price list fixed (PAY-1431)"`,
		Short: "List, show, approve and terminate a running sidecar's dead letters",
	}
	cmd.AddCommand(dlqListCmd(), dlqShowCmd(), dlqChangeCmd(deadletter.Approve), dlqChangeCmd(deadletter.Terminate))
	return refuseBadFlags(cmd)
}

// dlqSelection is the flags that select dead letters by source, state, reason
// and time.
type dlqSelection struct {
	source, reason, since, until string
	states                       []string
}

func (s *dlqSelection) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.source, "source", "", "only this source's dead letters")
	cmd.Flags().StringSliceVar(&s.states, "state", nil, "only dead letters in this state (repeat, or comma-separated): "+stateNames())
	cmd.Flags().StringVar(&s.reason, "dead-reason", "", "only dead letters dead-lettered for this reason (max-attempts, permanent, ...)")
	cmd.Flags().StringVar(&s.since, "since", "", "only dead letters dead-lettered at or after this: a time (RFC 3339) or a duration ago (2h)")
	cmd.Flags().StringVar(&s.until, "until", "", "only dead letters dead-lettered before this: a time (RFC 3339) or a duration ago")
}

// set reports whether any selecting flag was given.
func (s *dlqSelection) set() bool {
	return s.source != "" || s.reason != "" || s.since != "" || s.until != "" || len(s.states) > 0
}

// times reads --since and --until; now dates a duration.
func (s *dlqSelection) times(now time.Time) (since, until *timestamppb.Timestamp, err error) {
	if since, err = timeOrAgo("--since", s.since, now); err != nil {
		return nil, nil, err
	}
	if until, err = timeOrAgo("--until", s.until, now); err != nil {
		return nil, nil, err
	}
	for _, st := range s.states {
		if !deadletter.State(st).Valid() {
			return nil, nil, usageError("--state: %q is not a state (want %s)", st, stateNames())
		}
	}
	return since, until, nil
}

func stateNames() string {
	names := make([]string, len(deadletter.States))
	for i, s := range deadletter.States {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// timeOrAgo reads a time given as RFC 3339 or as a duration before now.
func timeOrAgo(name, v string, now time.Time) (*timestamppb.Timestamp, error) {
	if v == "" {
		return nil, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return timestamppb.New(t), nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return timestamppb.New(now.Add(-d)), nil
	}
	return nil, usageError("%s: want a time (2026-03-01T12:00:00Z) or a duration ago (90m), got %q", name, v)
}

func dlqListCmd() *cobra.Command {
	var (
		f       adminFlags
		sel     dlqSelection
		eventID string
		limit   int
		all     bool
	)
	cmd := &cobra.Command{
		Use: "list [--source S] [--state S]... [--dead-reason R] [--since T] [--until T] [--event-id ID] [--limit N] [--all]",
		Example: `  sidecar dlq list
  sidecar dlq list --source payments --state pending --dead-reason permanent --since 2h
  sidecar dlq list --all -o json`,
		Short: "List dead letters, then each source's open count and oldest open age",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > deadletter.MaxLimit {
				return usageError("--limit: want 1 to %d, got %d", deadletter.MaxLimit, limit)
			}
			since, until, err := sel.times(time.Now())
			if err != nil {
				return err
			}
			c, done, err := f.client()
			if err != nil {
				return err
			}
			defer done()
			req := &adminv1.ListDeadLettersRequest{Source: sel.source, States: sel.states, Reason: sel.reason,
				Since: since, Until: until, EventId: eventID, PageSize: int32(limit)}
			var out *adminv1.ListDeadLettersResponse
			for {
				ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
				page, err := c.ListDeadLetters(ctx, req)
				cancel()
				if err != nil {
					return err
				}
				if out == nil {
					out = page
				} else {
					out.DeadLetters = append(out.DeadLetters, page.GetDeadLetters()...)
					out.NextPageToken = page.GetNextPageToken()
				}
				if !all || page.GetNextPageToken() == "" {
					break
				}
				req.PageToken = page.GetNextPageToken()
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), out)
			}
			report.DeadLetters(cmd.OutOrStdout(), out)
			return nil
		},
	}
	sel.add(cmd)
	cmd.Flags().StringVar(&eventID, "event-id", "", "only the dead letters of this event")
	cmd.Flags().IntVar(&limit, "limit", deadletter.DefaultLimit, "dead letters asked for at a time")
	cmd.Flags().BoolVar(&all, "all", false, "list every page, not only the first")
	f.add(cmd)
	return cmd
}

func dlqShowCmd() *cobra.Command {
	var (
		f         adminFlags
		bodyLimit int
	)
	cmd := &cobra.Command{
		Use: "show ID [--body-limit N]",
		Example: `  sidecar dlq show orders.dlq/3
  sidecar dlq show payments.payments-handler.dlq/0/17 --body-limit 65536`,
		Short: "Show a dead letter: evidence, headers, body, repair, ledger history and attempt timeline",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if bodyLimit < 0 || bodyLimit > 1<<20 {
				return usageError("--body-limit: want 0 to %d bytes, got %d", 1<<20, bodyLimit)
			}
			m, err := f.call(cmd.Context(), func(ctx context.Context, c adminv1.AdminClient) (proto.Message, error) {
				return c.GetDeadLetter(ctx, &adminv1.GetDeadLetterRequest{Id: args[0], BodyLimit: int32(bodyLimit)})
			})
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), m)
			}
			report.DeadLetter(cmd.OutOrStdout(), m.(*adminv1.DeadLetter))
			return nil
		},
	}
	cmd.Flags().IntVar(&bodyLimit, "body-limit", 0, "show at most this many bytes of the body (0: the API's 64 KiB)")
	f.add(cmd)
	return cmd
}

func dlqChangeCmd(t deadletter.Transition) *cobra.Command {
	var (
		f                                    adminFlags
		reason, operator                     string
		repairBody, repairFile, repairCT, rn string
	)
	cmd := &cobra.Command{
		Use: string(t) + " ID... --reason R [--operator NAME]",
		Example: map[deadletter.Transition]string{
			deadletter.Approve:   "  sidecar dlq approve orders.dlq/3 --reason \"product added\"\n  sidecar dlq approve orders.dlq/3 --reason \"total fixed\" --repair-body '{\"total\": \"12.50\"}' --repair-note \"PAY-1431\"",
			deadletter.Terminate: "  sidecar dlq terminate orders.dlq/9 --reason \"a load-test order, not a real one\"",
		}[t],
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return usageError("--reason is required: say why, for whoever reads the ledger next")
			}
			body, err := repairFlags(cmd, repairBody, repairFile)
			if err != nil {
				return err
			}
			if body == nil && (repairCT != "" || rn != "") {
				return usageError("--repair-content-type and --repair-note go with --repair-body or --repair-body-file")
			}
			c, done, err := f.client()
			if err != nil {
				return err
			}
			defer done()
			failed := 0
			for _, id := range args {
				ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
				var d *adminv1.DeadLetter
				if t == deadletter.Approve {
					d, err = c.ApproveDeadLetter(ctx, &adminv1.ApproveDeadLetterRequest{Id: id, Reason: reason, Operator: operator,
						RepairBody: body, RepairContentType: repairCT, RepairNote: rn})
				} else {
					d, err = c.TerminateDeadLetter(ctx, &adminv1.TerminateDeadLetterRequest{Id: id, Reason: reason, Operator: operator})
				}
				cancel()
				if err != nil {
					failed++
					st := grpcstatus.Convert(err)
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: not %s: %s (%s)\n", report.Shown(id), pastTense(t), st.Message(), st.Code())
					continue
				}
				if f.output == "json" {
					if err := writeJSON(cmd.OutOrStdout(), d); err != nil {
						return err
					}
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", report.Shown(d.GetId()), report.Changed(d))
			}
			if failed > 0 {
				return fmt.Errorf("%d of %s not %s", failed, report.CountOf(len(args)), pastTense(t))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (required): recorded in the ledger")
	cmd.Flags().StringVar(&operator, "operator", os.Getenv("USER"), "who is acting, recorded after the token's name")
	if t == deadletter.Approve {
		cmd.Short = "Approve dead letters for a replay, optionally with a repaired body"
		cmd.Use = "approve ID... --reason R [--repair-body-file F | --repair-body STRING] [--repair-content-type CT] [--repair-note N] [--operator NAME]"
		cmd.Flags().StringVar(&repairBody, "repair-body", "", "a repaired body to replay instead of the original")
		cmd.Flags().StringVar(&repairFile, "repair-body-file", "", "read the repaired body from this file (- for standard input)")
		cmd.Flags().StringVar(&repairCT, "repair-content-type", "", "the repaired body's content type (default: the original's)")
		cmd.Flags().StringVar(&rn, "repair-note", "", "what the repair changed")
	} else {
		cmd.Short = "Close dead letters by hand, without a replay"
	}
	f.add(cmd)
	return cmd
}

// repairFlags reads the repaired body of --repair-body or
// --repair-body-file; nil when neither is given.
func repairFlags(cmd *cobra.Command, body, file string) ([]byte, error) {
	switch {
	case cmd.Flags().Changed("repair-body") && file != "":
		return nil, usageError("--repair-body and --repair-body-file: one or the other")
	case cmd.Flags().Changed("repair-body"):
		if body == "" {
			return nil, usageError("--repair-body: empty; leave it out to replay the original")
		}
		return []byte(body), nil
	case file == "":
		return nil, nil
	}
	var r io.Reader = cmd.InOrStdin()
	if file != "-" {
		fh, err := os.Open(file)
		if err != nil {
			return nil, usageError("--repair-body-file: %w", err)
		}
		defer fh.Close()
		r = fh
	}
	b, err := io.ReadAll(io.LimitReader(r, deadletter.MaxRepairBody+1))
	switch {
	case err != nil:
		return nil, usageError("--repair-body-file: %w", err)
	case len(b) > deadletter.MaxRepairBody:
		return nil, usageError("--repair-body-file: more than %s: a ledger record holds at most that", report.ByteSize(deadletter.MaxRepairBody))
	case len(b) == 0:
		return nil, usageError("--repair-body-file: empty; leave it out to replay the original")
	}
	return b, nil
}

func pastTense(t deadletter.Transition) string {
	if t == deadletter.Approve {
		return "approved"
	}
	return "terminated"
}
