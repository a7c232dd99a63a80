package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/redact"
	"handoff.dev/handoff/internal/sidecar"
)

func validateCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:     "validate --config FILE",
		Example: `  sidecar validate --config handoff.yaml`,
		Short:   "Check a config file and print every problem with its YAML path",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			// The token file is checked as run checks it: a file others
			// can read is refused here too.
			if _, err := sidecar.AdminToken(cfg.Admin); err != nil {
				return &exitError{code: exitConfig, err: err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", path)
			for _, n := range cfg.Notices() {
				fmt.Fprintf(cmd.OutOrStdout(), "notice: %s\n", n)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "", "config file (required)")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

// loadConfig loads path; a file with problems is an exit-2 error listing
// each with its YAML path.
func loadConfig(path string) (config.Config, error) {
	cfg, err := config.LoadEnv(path, os.LookupEnv)
	if err == nil {
		return cfg, nil
	}
	// Redacted once more here, where every problem leaves for the terminal:
	// a problem can quote a value from the file, and a value can be a URL
	// with a password.
	var ps config.Problems
	if errors.As(err, &ps) {
		msg := fmt.Sprintf("%s: %d problem(s):", path, len(ps))
		for _, p := range ps {
			msg += "\n  " + redact.Text(p.String())
		}
		return cfg, &exitError{code: exitConfig, err: errors.New(msg)}
	}
	return cfg, &exitError{code: exitConfig, err: redact.Error(err)}
}
