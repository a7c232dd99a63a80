package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"handoff.dev/handoff/internal/dev"
)

func devCmd() *cobra.Command {
	var o dev.Options
	cmd := &cobra.Command{
		Use: "dev",
		Example: `  sidecar dev
  sidecar dev --handler grpc --messages 12 --every 20ms --exit-when-done
  sidecar dev --app http://127.0.0.1:8080/events --batch 4
  sidecar dev --share-group`,
		Short: "Run the whole pipeline on an embedded Kafka with a demo producer and a demo app that fails some messages",
		Long: `dev starts an in-process Kafka cluster, a demo app on loopback that answers
most orders 200, fails some transiently (503, then 200) and rejects some (422),
and a producer of demo orders; then it runs the real sidecar between them and
prints what happens to each message: every attempt, its answer, and where the
message went. Ctrl-C stops it cleanly.

--handler grpc runs the demo app as a gRPC MessageHandler instead of an HTTP
endpoint, with the same answers. --app URL hands the orders to your own app
instead (any handler.url form, e.g. grpc://127.0.0.1:9000): each order is a
JSON body {"id": ..., "kind": "ok|flaky|early|bad|down"}, with its id as ce-id;
once the first order is handled it is published again, with the same ce-id,
as a producer's resend would be. The account then shows each order's retries
and deferrals too, read from the retry topics. --batch N hands the app up to N
orders a request (CloudEvents batched mode). --share-group consumes the topic
through a Kafka share group instead of a consumer group.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Handler != "http" && o.Handler != "grpc" {
				return &exitError{code: exitConfig, err: fmt.Errorf("--handler: want http or grpc, got %q", o.Handler)}
			}
			if o.Batch > 1 && o.App == "" {
				// The demo apps answer one order a request.
				return &exitError{code: exitConfig, err: errors.New("--batch: only with --app")}
			}
			o.Command = selfCommand()
			return dev.Run(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().IntVar(&o.Messages, "messages", 30, "orders to produce")
	cmd.Flags().DurationVar(&o.Every, "every", 250*time.Millisecond, "time between orders")
	cmd.Flags().BoolVar(&o.UntilEnd, "exit-when-done", false, "exit once every order is handled or dead-lettered")
	cmd.Flags().StringVar(&o.Handler, "handler", "http", "the demo app's transport: http or grpc")
	cmd.Flags().StringVar(&o.App, "app", "", "hand the orders to the app at this URL instead of the demo app (http://, grpc://, ...)")
	cmd.Flags().IntVar(&o.Batch, "batch", 1, "with --app, hand the app up to this many orders a request (handler.batch.max_messages)")
	cmd.Flags().BoolVar(&o.ShareGroup, "share-group", false, "consume through a share group (KIP-932) instead of a consumer group")
	cmd.Flags().StringVar(&o.Admin, "admin", "127.0.0.1:0", "serve the admin API here (a free port by default), with a token made for the run; \"\" turns it off")
	return cmd
}

// selfCommand is how a person in this directory runs this binary again:
// its path relative to here when it is below, "sidecar" when it was found
// on the PATH, go run's command for a binary go run built, else its
// absolute path.
func selfCommand() string {
	arg := os.Args[0]
	if filepath.Base(arg) == arg {
		return arg // found on the PATH
	}
	exe, err := filepath.Abs(arg)
	if err != nil {
		return arg
	}
	if strings.Contains(exe, string(filepath.Separator)+"go-build") {
		return "go run ./cmd/sidecar" // a binary go run built, gone when it ends
	}
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, exe); err == nil && filepath.IsLocal(rel) {
			return "./" + rel
		}
	}
	return exe
}
