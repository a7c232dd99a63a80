package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"

	"github.com/spf13/cobra"

	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/sidecar"
)

func runCmd() *cobra.Command {
	var path, cpuProfile, allocProfile string
	cmd := &cobra.Command{
		Use: "run --config FILE",
		Example: `  sidecar run --config handoff.yaml
  HANDOFF_JOURNAL_PATH=/var/lib/handoff/handoff.db sidecar run --config /etc/handoff/handoff.yaml --log-format json`,
		Short: "Consume every configured source and hand each message to the app",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			// Set up before the CPU profile, so that it is written after that
			// stops and its collection stays out of it.
			if allocProfile != "" {
				f, err := os.Create(allocProfile)
				if err != nil {
					return &exitError{code: exitConfig, err: fmt.Errorf("--alloc-profile: %w", err)}
				}
				defer func() {
					runtime.GC() // the profile counts up to the last collection
					err := pprof.Lookup("allocs").WriteTo(f, 0)
					if cerr := f.Close(); err == nil {
						err = cerr
					}
					if err != nil {
						log.Error("writing the allocation profile", "err", err)
					}
				}()
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return &exitError{code: exitConfig, err: fmt.Errorf("--cpu-profile: %w", err)}
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			return serve(cmd.Context(), cfg, sidecar.Options{Logger: log})
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "", "config file (required)")
	// The run's log only: the other commands answer on stdout and stderr.
	cmd.Flags().String("log-level", "info", "debug, info, warn or error")
	cmd.Flags().String("log-format", "", "text or json (default: text on a terminal, json otherwise, where a log collector reads it)")
	cmd.Flags().StringVar(&cpuProfile, "cpu-profile", "", "write a CPU profile (pprof) of the whole run to this file")
	cmd.Flags().StringVar(&allocProfile, "alloc-profile", "", "write a profile (pprof) of the run's allocations to this file when it stops")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

func newLogger(cmd *cobra.Command) (*slog.Logger, error) {
	levelName, _ := cmd.Flags().GetString("log-level")
	format, _ := cmd.Flags().GetString("log-format")
	var level slog.Level
	if err := level.UnmarshalText([]byte(levelName)); err != nil {
		return nil, &exitError{code: exitConfig, err: fmt.Errorf("--log-level: %w", err)}
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationText}
	switch strings.ToLower(format) {
	case "":
		// A person at a terminal reads text; a log collector, JSON.
		if isTerminal(os.Stderr) {
			return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
		}
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, &exitError{code: exitConfig, err: fmt.Errorf("--log-format: want text or json, got %q", format)}
}

// durationText writes a duration as people and log queries read it,
// "1.5s", rather than as nanoseconds.
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// serve builds the sidecar cfg describes and runs it until ctx ends.
func serve(ctx context.Context, cfg config.Config, o sidecar.Options) error {
	s, err := sidecar.Build(cfg, o)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}
