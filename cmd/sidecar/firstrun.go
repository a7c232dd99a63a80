package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"handoff.dev/handoff/internal/sidecar"
)

func declareCmd() *cobra.Command {
	var (
		path, source string
		partitions   int32
	)
	cmd := &cobra.Command{
		Use:   "declare --config FILE [--source NAME] [--partitions N]",
		Short: "Create the queue or topic a source consumes, when it is missing",
		Long: `declare creates what a configured source consumes, through the connection
its config block describes: a RabbitMQ quorum queue, or a Kafka topic of
--partitions partitions. What the sidecar needs beside it (retry tiers,
dead-letter queue or topic) it declares itself when it starts.`,
		Example: `  sidecar declare --config handoff.yaml
  sidecar declare --config handoff.yaml --source payments --partitions 6`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			names := []string{source}
			if source == "" {
				names = names[:0]
				for _, sc := range cfg.Sources {
					names = append(names, sc.Name)
				}
			}
			for _, name := range names {
				d, err := sidecar.Declare(cmd.Context(), cfg, name, partitions)
				if err != nil {
					return fmt.Errorf("source %s: %w", name, err)
				}
				what := map[string]string{"rabbitmq": "queue", "kafka": "topic"}[d.Broker]
				if d.Created {
					fmt.Fprintf(cmd.OutOrStdout(), "source %s: %s %s %s created\n", d.Source, d.Broker, what, d.Name)
				} else {
					fmt.Fprintf(cmd.OutOrStdout(), "source %s: %s %s %s is there already\n", d.Source, d.Broker, what, d.Name)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "", "config file (required)")
	cmd.Flags().StringVar(&source, "source", "", "only this source (default: every source)")
	cmd.Flags().Int32Var(&partitions, "partitions", 3, "a Kafka topic's partitions")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

func publishCmd() *cobra.Command {
	var (
		path, source, body, contentType, prefix string
		count                                   int
	)
	cmd := &cobra.Command{
		Use:   "publish --config FILE [--source NAME] [--count N] [--body TEXT]",
		Short: "Send test messages to a source's queue or topic, through its configured connection",
		Long: `publish sends --count messages to the queue or topic a configured source
consumes, and returns once the broker has confirmed each. Each has the id
PREFIX-N (its message id on RabbitMQ, its ce_id header and key on Kafka):
the event id the app is handed.`,
		Example: `  sidecar publish --config handoff.yaml --count 3
  sidecar publish --config handoff.yaml --source payments --body '{"amount": 12}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if count < 1 {
				return &exitError{code: exitConfig, err: fmt.Errorf("--count: want 1 or more, got %d", count)}
			}
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			if prefix == "" {
				prefix = "test-" + time.Now().UTC().Format("150405")
			}
			msgs := make([]sidecar.Message, count)
			for i := range msgs {
				msgs[i] = sidecar.Message{ID: fmt.Sprintf("%s-%d", prefix, i+1), ContentType: contentType, Body: []byte(body)}
			}
			if err := sidecar.Publish(cmd.Context(), cfg, source, msgs); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "published %d message(s): %s", count, msgs[0].ID)
			if count > 1 {
				fmt.Fprintf(cmd.OutOrStdout(), " … %s", msgs[count-1].ID)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return nil
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "", "config file (required)")
	cmd.Flags().StringVar(&source, "source", "", "the source to publish to (default: the only one)")
	cmd.Flags().IntVar(&count, "count", 1, "how many messages")
	cmd.Flags().StringVar(&body, "body", `{"hello":"handoff"}`, "each message's body")
	cmd.Flags().StringVar(&contentType, "content-type", "application/json", "each message's content type")
	cmd.Flags().StringVar(&prefix, "id-prefix", "", "each message's id is PREFIX-N (default: test-HHMMSS)")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}
