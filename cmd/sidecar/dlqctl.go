package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/deadletter"
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
		Use:   "dlq",
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
	cmd.Flags().StringVar(&s.reason, "reason", "", "only dead letters of this dead-letter reason (max-attempts, permanent, ...)")
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
		f     adminFlags
		sel   dlqSelection
		limit int
		all   bool
	)
	cmd := &cobra.Command{
		Use:   "list [--source S] [--state S]... [--reason R] [--since T] [--until T] [--limit N] [--all]",
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
				Since: since, Until: until, PageSize: int32(limit)}
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
			writeDeadLetters(cmd.OutOrStdout(), out)
			return nil
		},
	}
	sel.add(cmd)
	cmd.Flags().IntVar(&limit, "limit", deadletter.DefaultLimit, "dead letters asked for at a time")
	cmd.Flags().BoolVar(&all, "all", false, "list every page, not only the first")
	f.add(cmd)
	return cmd
}

// writeDeadLetters prints a list as a table, then the counts of each
// source.
func writeDeadLetters(w io.Writer, l *adminv1.ListDeadLettersResponse) {
	if len(l.GetDeadLetters()) == 0 {
		fmt.Fprintln(w, "no dead letters match")
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tSOURCE\tREASON\tATTEMPTS\tDEAD-LETTERED\tEVENT")
		for _, d := range l.GetDeadLetters() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", shown(d.GetId()), d.GetState(), shown(d.GetSource()), shown(d.GetReason()),
				d.GetAttempts(), tableTime(d.GetDeadLetteredAt()), shown(d.GetEventId()))
		}
		_ = tw.Flush()
	}
	if l.GetNextPageToken() != "" {
		fmt.Fprintln(w, "(more: --all lists every page)")
	}
	fmt.Fprintln(w)
	for _, c := range l.GetCounts() {
		fmt.Fprintln(w, countsLine(c))
	}
}

// countsLine is what an operator watches of one source: the open count and
// the oldest open one's age first, then the count by state.
func countsLine(c *adminv1.DeadLetterCounts) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: open %d", c.GetSource(), c.GetOpen())
	if c.GetOpen() > 0 && c.GetOldestOpenAge() != nil {
		fmt.Fprintf(&b, ", oldest open %s", c.GetOldestOpenAge().AsDuration().Round(time.Second))
	}
	var parts []string
	by := maps.Clone(c.GetByState())
	for _, s := range deadletter.States {
		if n, ok := by[string(s)]; ok {
			parts = append(parts, fmt.Sprintf("%s %d", s, n))
			delete(by, string(s))
		}
	}
	for _, s := range slices.Sorted(maps.Keys(by)) { // a state a newer sidecar knows
		parts = append(parts, fmt.Sprintf("%s %d", shown(s), by[s]))
	}
	if len(parts) > 0 {
		b.WriteString("; " + strings.Join(parts, ", "))
	}
	return b.String()
}

// tableTime is a time for a table: UTC to the second; "-" when unset.
func tableTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

// shown is s as it is when it is printable, quoted otherwise: what a
// broker's header or an app's error says must not steer the terminal.
func shown(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) || r == utf8.RuneError {
			return strconv.Quote(s)
		}
	}
	return s
}

func dlqShowCmd() *cobra.Command {
	var (
		f         adminFlags
		bodyLimit int
	)
	cmd := &cobra.Command{
		Use:   "show ID [--body-limit N]",
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
			writeDeadLetter(cmd.OutOrStdout(), m.(*adminv1.DeadLetter))
			return nil
		},
	}
	cmd.Flags().IntVar(&bodyLimit, "body-limit", 0, "show at most this many bytes of the body (0: the API's 64 KiB)")
	f.add(cmd)
	return cmd
}

// writeDeadLetter prints one dead letter for a reader.
func writeDeadLetter(w io.Writer, d *adminv1.DeadLetter) {
	field := func(name, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-15s%s\n", name, v)
		}
	}
	field("id", shown(d.GetId()))
	field("source", shown(d.GetSource()))
	field("state", d.GetState())
	field("event", shown(d.GetEventId()))
	field("reason", shown(d.GetReason()))
	errLine := shown(d.GetError())
	if d.GetErrorClass() != "" {
		errLine += " (" + shown(d.GetErrorClass()) + ")"
	}
	field("error", strings.TrimSpace(errLine))
	field("attempts", strconv.Itoa(int(d.GetAttempts())))
	field("origin", shown(d.GetOrigin()))
	if d.GetFirstFailureAt() != nil {
		field("first failure", tableTime(d.GetFirstFailureAt()))
	}
	field("dead-lettered", tableTime(d.GetDeadLetteredAt()))
	if d.GetReplayOf() != "" {
		field("replay of", shown(d.GetReplayOf())+" (replay "+shown(d.GetReplayId())+")")
	}
	field("successor", shown(d.GetSuccessor()))
	field("content type", shown(d.GetContentType()))
	if len(d.GetKey()) > 0 {
		field("key", shown(string(d.GetKey())))
	}
	if len(d.GetHeaders()) > 0 {
		fmt.Fprintln(w, "headers")
		for _, k := range slices.Sorted(maps.Keys(d.GetHeaders())) {
			fmt.Fprintf(w, "  %s: %s\n", shown(k), shown(d.GetHeaders()[k]))
		}
	}

	switch {
	case d.GetBodyError() != "":
		fmt.Fprintf(w, "body (%s): %s\n", byteSize(d.GetBodySize()), d.GetBodyError())
	case d.GetBodyTruncated():
		fmt.Fprintf(w, "body (%s, the first %s shown; --body-limit shows more)\n", byteSize(d.GetBodySize()), byteSize(int64(len(d.GetBody()))))
		writeBody(w, d.GetBody())
	default:
		fmt.Fprintf(w, "body (%s)\n", byteSize(int64(len(d.GetBody()))))
		writeBody(w, d.GetBody())
	}
	if r := d.GetRepair(); r != nil {
		fmt.Fprintf(w, "repair (%s, %s)", byteSize(int64(len(r.GetBody()))), shown(r.GetContentType()))
		if r.GetNote() != "" {
			fmt.Fprintf(w, ": %s", shown(r.GetNote()))
		}
		fmt.Fprintln(w)
		writeBody(w, r.GetBody())
	}
	if len(d.GetHistory()) > 0 {
		fmt.Fprintln(w, "history")
		for _, h := range d.GetHistory() {
			fmt.Fprintf(w, "  %s  %s\n", tableTime(h.GetAt()), historyLine(h))
		}
	}
	if len(d.GetHandoffs()) > 0 {
		fmt.Fprintln(w, "timeline")
		writeEvent(indentWriter{w}, &adminv1.Event{Source: d.GetSource(), EventId: d.GetEventId(), Handoffs: d.GetHandoffs()})
	} else if d.GetEventId() != "" {
		// The timeline is the journal's, and a journal is one replica's.
		fmt.Fprintln(w, "timeline       not in this replica's journal: the replica that handled the event has it")
	}
}

// historyLine is one ledger record: the transition, who, why.
func historyLine(h *adminv1.LedgerRecord) string {
	s := fmt.Sprintf("%s → %s by %s", h.GetTransition(), h.GetState(), shown(h.GetWho()))
	if h.GetReplayId() != "" {
		s += " (replay " + shown(h.GetReplayId()) + ")"
	}
	if h.GetSuccessor() != "" {
		s += " (became " + shown(h.GetSuccessor()) + ")"
	}
	if h.GetRepair() != nil {
		s += fmt.Sprintf(" with a repair of %s", byteSize(int64(len(h.GetRepair().GetBody()))))
	}
	if h.GetWhy() != "" {
		s += ": " + shown(h.GetWhy())
	}
	return s
}

// writeBody prints a body indented: as text when it is printable text, as
// a hex dump otherwise.
func writeBody(w io.Writer, b []byte) {
	if len(b) == 0 {
		return
	}
	if textBody(b) {
		for line := range strings.Lines(string(b)) {
			fmt.Fprintf(w, "  %s\n", strings.TrimRight(line, "\r\n"))
		}
		return
	}
	for line := range strings.Lines(hex.Dump(b)) {
		fmt.Fprintf(w, "  %s", line)
	}
}

// textBody reports whether b is UTF-8 text without control characters other
// than line breaks and tabs (a body cut in the middle of a character still
// counts).
func textBody(b []byte) bool {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 && !(len(b) < utf8.UTFMax && !utf8.FullRune(b)) {
			return false
		}
		if r != '\n' && r != '\r' && r != '\t' && unicode.IsControl(r) {
			return false
		}
		b = b[n:]
	}
	return true
}

// indentWriter writes every line two spaces in.
type indentWriter struct{ w io.Writer }

func (i indentWriter) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		if _, err := io.WriteString(i.w, "  "+line); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func dlqChangeCmd(t deadletter.Transition) *cobra.Command {
	var (
		f                                    adminFlags
		reason, operator                     string
		repairBody, repairFile, repairCT, rn string
	)
	cmd := &cobra.Command{
		Use:  string(t) + " ID... --reason R [--operator NAME]",
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
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: not %s: %s (%s)\n", shown(id), pastTense(t), st.Message(), st.Code())
					continue
				}
				if f.output == "json" {
					if err := writeJSON(cmd.OutOrStdout(), d); err != nil {
						return err
					}
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", shown(d.GetId()), changeResult(d))
			}
			if failed > 0 {
				return fmt.Errorf("%d of %s not %s", failed, deadLetters(len(args)), pastTense(t))
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
		return nil, usageError("--repair-body-file: more than %s: a ledger record holds at most that", byteSize(deadletter.MaxRepairBody))
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

// changeResult says what a change left: the state, and the repair if any.
func changeResult(d *adminv1.DeadLetter) string {
	s := d.GetState()
	if r := d.GetRepair(); r != nil && d.GetState() == string(deadletter.Approved) {
		s += fmt.Sprintf(", with a repair of %s (%s)", byteSize(int64(len(r.GetBody()))), shown(r.GetContentType()))
	}
	if h := d.GetHistory(); len(h) > 0 {
		s += " by " + shown(h[len(h)-1].GetWho())
	}
	return s
}
