package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/report"
)

func journalCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "journal",
		Example: `  sidecar journal events --event order-1
  sidecar journal repair --path /var/lib/handoff/handoff.db`,
		Short: "Read, repair or reset a hand-off journal file (the sidecar must be stopped)",
	}
	cmd.AddCommand(journalEventsCmd(), journalRepairCmd(), journalResetCmd())
	return cmd
}

func journalEventsCmd() *cobra.Command {
	var (
		path, event  string
		open, asJSON bool
		since        time.Duration
	)
	cmd := &cobra.Command{
		Use: "events --path FILE [--event ID | --open | --since DURATION]",
		Example: `  sidecar journal events --event order-1
  sidecar journal events --open
  sidecar journal events --since 15m --json`,
		Short: "Print hand-off timelines: received, each attempt with outcome and latency, copies, confirms, settle",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			j, _, err := journal.Open(path, journal.Options{ReadOnly: true, Logger: discardLogger()})
			if err != nil {
				return err
			}
			defer j.Close()
			f := journal.Filter{EventID: event, Open: open}
			if since > 0 {
				f.Since = time.Now().Add(-since)
			}
			out := cmd.OutOrStdout()
			n := 0
			err = j.Scan(f, func(k journal.Key, steps []journal.Step) error {
				n++
				if asJSON {
					return report.TimelineJSON(out, k, steps)
				}
				report.Timeline(out, k, steps)
				return nil
			})
			if err != nil {
				return err
			}
			if n == 0 && !asJSON {
				fmt.Fprintln(out, "no matching hand-offs")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "path", config.DefaultJournalPath(), "journal file (journal.path)")
	cmd.Flags().StringVar(&event, "event", "", "only this event id")
	cmd.Flags().BoolVar(&open, "open", false, "only hand-offs not yet settled")
	cmd.Flags().DurationVar(&since, "since", 0, "only hand-offs with a record in this last duration, e.g. 15m")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per hand-off")
	_ = cmd.MarkFlagRequired("path")
	return cmd
}

func journalRepairCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:     "repair --path FILE",
		Example: `  sidecar journal repair --path /var/lib/handoff/handoff.db`,
		Short:   "Move a damaged journal aside and rebuild it from every record that can be read",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := journal.Repair(path)
			if rep.Aside != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "damaged journal kept at %s\n", rep.Aside)
			}
			if err != nil {
				return err
			}
			if rep.Stopped != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "reading stopped early: %v\n", rep.Stopped)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "new journal %s: %d records kept, %d unreadable parts dropped\n", path, rep.Kept, rep.Lost)
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "path", config.DefaultJournalPath(), "journal file (journal.path)")
	return cmd
}

func journalResetCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:     "reset --path FILE",
		Example: `  sidecar journal reset --path /var/lib/handoff/handoff.db`,
		Short:   "Move the journal aside and start an empty one (the broker still holds every unacked message)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			aside, err := journal.Reset(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "old journal kept at %s; %s is empty\n", aside, path)
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "path", config.DefaultJournalPath(), "journal file (journal.path)")
	return cmd
}
