// Command sidecar is Handoff: it consumes from a broker on an app's behalf and
// hands each message to the app's local HTTP endpoint.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/spf13/cobra"

	"handoff.dev/handoff/internal/buildinfo"
	"handoff.dev/handoff/internal/redact"
	"handoff.dev/handoff/internal/sidecar"
)

// exitConfig is the exit code for a configuration the sidecar refuses.
const exitConfig = 2

// exitError carries a specific exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func main() {
	// Under a file size limit (ulimit -f, a container's), a write past it
	// raises SIGXFSZ, which would kill the process. Ignored, the write
	// fails with EFBIG, which the journal treats as no room: intake waits
	// until it can write, and nothing is acked unwritten.
	signal.Ignore(syscall.SIGXFSZ)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal takes the default action: exit now
	}()
	err := rootCmd().ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	code := 1
	var ee *exitError
	var ce *sidecar.ConfigError
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case errors.As(err, &ce):
		code = exitConfig
	}
	fmt.Fprintln(os.Stderr, lastWord(err))
	os.Exit(code)
}

// lastWord is what the command says of the error it ends on. It may quote a
// URL from the config: never its password.
func lastWord(err error) string {
	return "sidecar: " + redact.Error(plainRPC(err)).Error()
}

// plainRPC words an admin API refusal for a person: its message and its
// code, not gRPC's "rpc error: code = … desc = …".
func plainRPC(err error) error {
	st, ok := grpcstatus.FromError(err)
	if !ok || st.Code() == codes.OK {
		return err
	}
	return fmt.Errorf("%s (%s)", st.Message(), st.Code())
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "sidecar",
		Short:         "Handoff: reliable broker consumption for a local HTTP app",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildinfo.Get().String(),
	}
	root.AddCommand(runCmd(), validateCmd(), declareCmd(), publishCmd(), journalCmd(), devCmd(), statusCmd(), eventsCmd(), dlqCmd(), replayCmd())
	return root
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
