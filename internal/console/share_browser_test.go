package console_test

import (
	"context"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kfake"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/sidecar"
	"handoff.dev/handoff/internal/testkit"
)

// A source consuming through a Kafka share group says so on the overview:
// the group, its delivery limit and lock as the sidecar read them, and the
// group that reads its retry topics.
func TestConsoleShowsAShareGroup(t *testing.T) {
	brokertest.SkipShort(t, "Chromium")
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("Chromium is required (apt-get install chromium; .ci/run installs it): ", err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "jobs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	app := newApp(t)
	const tok = "console-share-token"
	declare := true
	cfg := config.Default()
	cfg.Handler.URL = app.url
	cfg.Sources = []config.Source{{Name: "jobs", Kafka: &config.Kafka{Brokers: cluster.ListenAddrs(), Topic: "jobs", ShareGroup: "workers", Declare: &declare}}}
	cfg.Retry.Tiers = []config.Duration{config.Duration(time.Second)}
	cfg.Journal.Path = filepath.Join(t.TempDir(), "handoff.db")
	cfg.Admin.Listen, cfg.Admin.Token, cfg.Admin.TokenName = "127.0.0.1:0", tok, "console-test"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := sidecar.Build(cfg, sidecar.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, s.Run)
	base := "http://" + s.AdminAddr()

	b := newBrowser(t, chrome)
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	card := `document.querySelector('[data-source="jobs"]')`
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SetValue(chromedp.ID("token"), tok), chromedp.Click(chromedp.ID("signin")),
		void(chromedp.Poll[bool](card+` !== null && `+card+`.innerText.includes('Share group')`))); err != nil {
		page, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("the overview: %v (%s)\n%s", err, b.errors(), page)
	}
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](card+`.innerText`))
	if err != nil {
		t.Fatal(err)
	}
	want := "workers: archived after 5 deliveries, lock 30 s (read from brokers); retries read by workers.retries"
	if !strings.Contains(text, want) {
		t.Errorf("the source's card says:\n%s\nwant %q", text, want)
	}
	if errs := b.errors(); errs != "" {
		t.Errorf("the page logged errors: %s", errs)
	}
}
