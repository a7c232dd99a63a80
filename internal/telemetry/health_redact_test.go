package telemetry

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"handoff.dev/handoff/internal/testkit"
)

// /readyz shows why a part is not ready, but not a password quoted in the
// reason: anyone who reaches the port can read it.
func TestReadyzHidesPasswords(t *testing.T) {
	s, err := Listen("127.0.0.1:0", []Check{{Name: "source a", Ready: func() error {
		return fmt.Errorf("dial: parse %q: invalid", "amqp://u:Pw-3c8e@127.0.0.1:5672/")
	}}}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, s.Run)
	resp, err := http.Get("http://" + s.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if body := string(b); resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(body, "Pw-3c8e") || !strings.Contains(body, "source a: dial: parse \"amqp://u:xxxxx@127.0.0.1:5672/\"") {
		t.Errorf("/readyz = %d %q: want 503 with the reason, its password masked", resp.StatusCode, body)
	}
}
