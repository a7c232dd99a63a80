package main

import (
	"context"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/adminclient"
	"handoff.dev/handoff/internal/report"
)

func replayCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "replay",
		Example: `  sidecar replay start --source orders --dry-run
  sidecar replay start --source orders --sample 5 --reason "fix deployed" --follow
  sidecar replay list`,
		Short: "Start, follow, list, pause and cancel replays of a running sidecar's dead letters",
	}
	cmd.AddCommand(replayStartCmd(), replayStatusCmd(), replayListCmd(), replayCancelCmd(), replayPauseCmd(), replayResumeCmd())
	return refuseBadFlags(cmd)
}

func replayStartCmd() *cobra.Command {
	var (
		f                   adminFlags
		sel                 dlqSelection
		rate, ratio         float64
		batch, sample       int
		sampleTimeout       time.Duration
		force, dryRun, foll bool
		why, operator       string
	)
	cmd := &cobra.Command{
		Use: "start [ID...] [--source S --dead-reason R --since T --until T --state S] [--rate N] [--batch-size N] [--sample N] " +
			"[--stop-failure-ratio X] [--force] [--dry-run] [--reason WHY] [--follow]",
		Example: `  sidecar replay start --source orders --dry-run
  sidecar replay start --source orders --dead-reason permanent --since 2h --sample 5 --reason "fix deployed" --follow
  sidecar replay start orders.dlq/3 orders.dlq/5 --force --rate 2 --reason "checked by hand"`,
		Short: "Replay dead letters to their source: by id, or a selection (approved ones unless --force)",
		RunE: func(cmd *cobra.Command, ids []string) error {
			switch {
			case len(ids) > 0 && sel.set():
				return usageError("name dead letters by id, or select them with --source and the rest: not both")
			case len(ids) == 0 && sel.source == "":
				return usageError("name dead letters by id, or select them with --source")
			case rate < 0 || batch < 0 || sample < 0 || sampleTimeout < 0:
				return usageError("--rate, --batch-size, --sample and --sample-timeout: want 0 (the default) or more")
			case ratio < 0 || ratio > 1:
				return usageError("--stop-failure-ratio: want a share from 0 to 1, got %v", ratio)
			}
			since, until, err := sel.times(time.Now())
			if err != nil {
				return err
			}
			req := &adminv1.CreateReplayRequest{Ids: ids, Source: sel.source, Reason: sel.reason, Since: since, Until: until, States: sel.states,
				Force: force, RatePerSecond: rate, BatchSize: int32(batch), Sample: int32(sample), StopFailureRatio: ratio,
				DryRun: dryRun, Why: why, Operator: operator}
			if sampleTimeout > 0 {
				req.SampleTimeout = durationpb.New(sampleTimeout)
			}
			c, done, err := f.client()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
			r, err := c.CreateReplay(ctx, req)
			cancel()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if r.GetDryRun() || !foll {
				if f.output == "json" {
					return writeJSON(out, r)
				}
				report.ReplayStarted(out, r)
				return nil
			}
			if f.output == "text" {
				report.ReplayStarted(out, r)
			}
			return followAndReport(cmd, &f, c, r.GetId())
		},
	}
	sel.add(cmd)
	cmd.Flags().Float64Var(&rate, "rate", 0, "messages published per second (0: the sidecar's default, 10)")
	cmd.Flags().IntVar(&batch, "batch-size", 0, "published between two checks of the stop threshold and the app's pressure (0: 10)")
	cmd.Flags().IntVar(&sample, "sample", 0, "publish this many first, then wait for their outcomes before going on")
	cmd.Flags().DurationVar(&sampleTimeout, "sample-timeout", 0, "how long to wait for the sample's outcomes (0: 5m)")
	cmd.Flags().Float64Var(&ratio, "stop-failure-ratio", 0, "stop when more than this share of the replayed copies fail (0: 0.5; 1 never stops)")
	cmd.Flags().BoolVar(&force, "force", false, "replay pending dead letters too, approving them on the way")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "say what would be replayed, and start nothing")
	cmd.Flags().StringVar(&why, "reason", "", "why: recorded with the replay")
	// Its name before --reason meant the recorded reason here as on every
	// other command.
	cmd.Flags().StringVar(&why, "why", "", "")
	_ = cmd.Flags().MarkDeprecated("why", "use --reason")
	cmd.Flags().StringVar(&operator, "operator", os.Getenv("USER"), "who is acting, recorded after the token's name")
	cmd.Flags().BoolVar(&foll, "follow", false, "show the replay's progress until it ends")
	f.add(cmd)
	return cmd
}

// followAndReport follows a replay to its end, then prints it: a summary,
// or the final Replay as JSON.
func followAndReport(cmd *cobra.Command, f *adminFlags, c adminv1.AdminClient, id string) error {
	bar := cmd.ErrOrStderr()
	file, ok := bar.(*os.File)
	r, err := adminclient.Follow(cmd.Context(), c, f.timeout, id, bar, ok && isTerminal(file))
	if err != nil {
		return err
	}
	if f.output == "json" {
		return writeJSON(cmd.OutOrStdout(), r)
	}
	report.ReplaySummary(cmd.OutOrStdout(), r)
	return nil
}

func replayStatusCmd() *cobra.Command {
	var (
		f    adminFlags
		foll bool
	)
	cmd := &cobra.Command{
		Use:     "status ID [--follow]",
		Example: `  sidecar replay status replay-20261201T174204Z-d42013a3 --follow`,
		Short:   "Show a replay's state and progress",
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if foll {
				c, done, err := f.client()
				if err != nil {
					return err
				}
				defer done()
				return followAndReport(cmd, &f, c, args[0])
			}
			m, err := f.call(cmd.Context(), func(ctx context.Context, c adminv1.AdminClient) (proto.Message, error) {
				return c.GetReplay(ctx, &adminv1.GetReplayRequest{Id: args[0]})
			})
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), m)
			}
			report.Replay(cmd.OutOrStdout(), m.(*adminv1.Replay))
			return nil
		},
	}
	cmd.Flags().BoolVar(&foll, "follow", false, "show the replay's progress until it ends")
	f.add(cmd)
	return cmd
}

func replayListCmd() *cobra.Command {
	var (
		f      adminFlags
		source string
	)
	cmd := &cobra.Command{
		Use:     "list [--source S]",
		Example: `  sidecar replay list --source orders`,
		Short:   "List the replays the ledgers hold, newest first",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := f.call(cmd.Context(), func(ctx context.Context, c adminv1.AdminClient) (proto.Message, error) {
				return c.ListReplays(ctx, &adminv1.ListReplaysRequest{Source: source})
			})
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), m)
			}
			report.Replays(cmd.OutOrStdout(), m.(*adminv1.ListReplaysResponse))
			return nil
		},
	}
	cmd.Flags().StringVar(&source, "source", "", "only this source's replays")
	f.add(cmd)
	return cmd
}

func replayCancelCmd() *cobra.Command {
	return replayOpCmd("cancel", "Stop a replay; what it published stays published",
		`  sidecar replay cancel replay-20261201T174204Z-d42013a3 --reason "want a sample first"`,
		func(ctx context.Context, c adminv1.AdminClient, id, reason, operator string) (*adminv1.Replay, error) {
			return c.CancelReplay(ctx, &adminv1.CancelReplayRequest{Id: id, Reason: reason, Operator: operator})
		})
}

func replayPauseCmd() *cobra.Command {
	return replayOpCmd("pause", "Hold a replay before its next publish, until it is resumed",
		`  sidecar replay pause replay-20261201T174204Z-d42013a3 --reason "the app is being fixed"`,
		func(ctx context.Context, c adminv1.AdminClient, id, reason, operator string) (*adminv1.Replay, error) {
			return c.PauseReplay(ctx, &adminv1.PauseReplayRequest{Id: id, Reason: reason, Operator: operator})
		})
}

func replayResumeCmd() *cobra.Command {
	return replayOpCmd("resume", "Let a paused replay go on",
		`  sidecar replay resume replay-20261201T174204Z-d42013a3`,
		func(ctx context.Context, c adminv1.AdminClient, id, reason, operator string) (*adminv1.Replay, error) {
			return c.ResumeReplay(ctx, &adminv1.ResumeReplayRequest{Id: id, Reason: reason, Operator: operator})
		})
}

// replayOpCmd is an operator's command on one replay: cancel, pause or
// resume, with a reason and an operator recorded in the ledger.
func replayOpCmd(verb, short, example string,
	do func(ctx context.Context, c adminv1.AdminClient, id, reason, operator string) (*adminv1.Replay, error)) *cobra.Command {
	var (
		f                adminFlags
		reason, operator string
	)
	cmd := &cobra.Command{
		Use:     verb + " ID [--reason R]",
		Example: example,
		Short:   short,
		Args:    usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := f.call(cmd.Context(), func(ctx context.Context, c adminv1.AdminClient) (proto.Message, error) {
				return do(ctx, c, args[0], reason, operator)
			})
			if err != nil {
				return err
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), m)
			}
			report.ReplaySummary(cmd.OutOrStdout(), m.(*adminv1.Replay))
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why: recorded in the ledger")
	cmd.Flags().StringVar(&operator, "operator", os.Getenv("USER"), "who is acting, recorded after the token's name")
	f.add(cmd)
	return cmd
}
