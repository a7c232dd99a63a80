package console_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/chromedp/chromedp"

	"handoff.dev/handoff/internal/broker/brokertest"
	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/sidecar"
	"handoff.dev/handoff/internal/testkit"
)

// The console as an operator meets it, in headless Chromium against a real
// sidecar on the local RabbitMQ with dead letters: a wrong token is refused
// and changes nothing; the right one shows the overview with its chart
// moving; the dead letters filter; one opens, is approved with a repaired
// body (shown as a diff) and replayed, and the app receives the repaired
// body; the replay reaches completed; an event's timeline shows. It works at
// 1280×800 and at a phone's width, every control has a label, and the
// page's JavaScript logs no error. With -update it rewrites the screenshots
// in docs/.
func TestConsoleInChromium(t *testing.T) {
	brokertest.SkipShort(t, "RabbitMQ and Chromium")
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("Chromium is required (apt-get install chromium; .ci/run installs it): ", err)
	}
	app := newApp(t)
	const tok = "console-test-token"
	s, cfg := startSidecar(t, app.url, tok)
	base := "http://" + s.AdminAddr()

	var msgs []sidecar.Message
	for i := 1; i <= 6; i++ {
		msgs = append(msgs, sidecar.Message{ID: fmt.Sprintf("good-%d", i), ContentType: "application/json", Body: fmt.Appendf(nil, `{"order":%d}`, i)})
	}
	for i := 1; i <= 3; i++ {
		msgs = append(msgs, sidecar.Message{ID: fmt.Sprintf("bad-%d", i), ContentType: "application/json",
			Body: fmt.Appendf(nil, "{\n  \"order\": %d,\n  \"sku\": \"bad-sku\"\n}", 100+i)})
	}
	if err := sidecar.Publish(context.Background(), cfg, "orders", msgs); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, "three dead letters in the index", func() bool {
		var res struct {
			DeadLetters []json.RawMessage `json:"deadLetters"`
		}
		return getJSON(base+"/v1/deadletters", tok, &res) == nil && len(res.DeadLetters) == 3
	})
	// Traffic while the overview is shown, for its chart to move.
	stopTraffic := make(chan struct{})
	var trafficDone sync.WaitGroup
	trafficDone.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopTraffic:
				return
			case <-time.After(300 * time.Millisecond):
			}
			_ = sidecar.Publish(context.Background(), cfg, "orders", []sidecar.Message{{ID: fmt.Sprintf("more-%d", i), ContentType: "application/json", Body: []byte(`{"order":0}`)}})
		}
	})
	defer func() { close(stopTraffic); trafficDone.Wait() }()

	b := newBrowser(t, chrome)
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(b.ctx, 90*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, actions...); err != nil {
			page, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.hash + "\n" + document.body.innerText`))
			t.Fatalf("%s: %v\nthe page (%s):\n%s", what, err, b.errors(), page)
		}
	}
	// eval is an expression's value on the page; into keeps it as a step.
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		return v
	}
	poll := func(expr string) chromedp.Action[chromedp.Void] {
		return void(chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(60*time.Second)))
	}
	do := func(expr string) chromedp.Action[chromedp.Void] {
		return void(chromedp.Evaluate[bool](expr + `; true`))
	}

	// A wrong token: refused, and nothing is kept.
	run("a wrong token", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), "not-the-token"), chromedp.Click(chromedp.ID("signin")),
		poll(`document.querySelector('#login-error').textContent.includes('refused')`))
	if got := eval(`String(sessionStorage.getItem('handoff.token'))`); got != "null" {
		t.Fatalf("a refused token was kept: %q", got)
	}

	// The overview, its chart moving.
	var firstAt string
	run("the overview", chromedp.SetValue(chromedp.ID("token"), tok), chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("chart")),
		poll(`(() => { const c = document.querySelector('#chart'); return c && Number(c.dataset.handled) > 0 && c.querySelector('polyline.s-handled') !== null; })()`))
	firstAt = eval(`document.querySelector('#chart').dataset.lastAt`)
	run("the chart moves", poll(fmt.Sprintf(`document.querySelector('#chart').dataset.lastAt !== %q`, firstAt)),
		poll(`document.querySelector('[data-source="orders"]').textContent.includes('connected')`))
	if got := eval(`document.querySelector('#ready').textContent`); !strings.HasPrefix(got, "Ready") {
		t.Errorf("overview banner %q", got)
	}
	b.screenshot(t, "console-overview.png")
	b.labelled(t, "overview")

	// The dead letters, filtered: by reason and state, then by event id.
	run("filter dead letters", chromedp.Navigate(base+"/ui/#/deadletters"), chromedp.WaitVisible(chromedp.ID("dl-filters")),
		chromedp.SetValue(chromedp.ID("f-reason"), "permanent"), chromedp.SetValue(chromedp.ID("f-state"), "pending"),
		chromedp.Click(chromedp.ID("f-apply")),
		poll(`location.hash.includes('reason=permanent') && document.querySelectorAll('#dl-list tbody tr').length === 3`),
		poll(`document.querySelector('#dl-counts').textContent.includes('pending')`))
	b.labelled(t, "dead letters")
	run("filter by event id", chromedp.SetValue(chromedp.ID("f-event"), "bad-2"), chromedp.Click(chromedp.ID("f-apply")),
		poll(`document.querySelectorAll('#dl-list tbody tr').length === 1 && document.querySelector('#dl-list tbody tr').textContent.includes('bad-2')`))
	id := eval(`document.querySelector('#dl-list tbody tr').dataset.id`)

	// One opened: its evidence and body.
	run("open a dead letter", chromedp.Click(chromedp.CSS(`#dl-list tbody tr a`)), chromedp.WaitVisible(chromedp.ID("approve-box")),
		poll(`document.querySelector('#dl-body').textContent.includes('bad-sku')`),
		poll(`document.querySelector('main').textContent.includes('permanent')`))
	b.labelled(t, "a dead letter")

	// A token that no longer holds: the approval is refused, the tab signs
	// out, and the dead letter is unchanged.
	run("approve with a wrong token", do(`sessionStorage.setItem('handoff.token', 'stale')`),
		chromedp.SetValue(chromedp.ID("approve-reason"), "should not count"), chromedp.Click(chromedp.ID("approve")),
		chromedp.WaitVisible(chromedp.ID("confirm-yes")), chromedp.Click(chromedp.ID("confirm-yes")),
		chromedp.WaitVisible(chromedp.ID("token")), poll(`document.querySelector('#login-error').textContent.includes('refused')`))
	if state := letterState(t, base, tok, id); state != "pending" {
		t.Fatalf("%s is %s after a refused approval", id, state)
	}

	// Approved with a repaired body, shown as a diff first.
	repaired := "{\n  \"order\": 102,\n  \"sku\": \"fixed-sku\"\n}"
	run("repair before approving", chromedp.SetValue(chromedp.ID("token"), tok), chromedp.Click(chromedp.ID("signin")),
		chromedp.Navigate(base+"/ui/#/deadletter/"+id), chromedp.WaitVisible(chromedp.ID("approve-box")),
		chromedp.SetValue(chromedp.ID("approve-reason"), "sku corrected by the catalogue team"),
		chromedp.Click(chromedp.ID("repair-on")), chromedp.WaitVisible(chromedp.ID("repair-body")),
		do(fmt.Sprintf(`(() => { const e = document.querySelector('#repair-body'); e.value = %s; e.dispatchEvent(new Event('input')); })()`, jsString(repaired))),
		poll(`document.querySelector('#repair-diff .add').textContent.includes('fixed-sku') && document.querySelector('#repair-diff .del').textContent.includes('bad-sku')`),
		chromedp.SetValue(chromedp.ID("repair-note"), "sku renamed"))
	b.screenshot(t, "console-deadletter.png")
	b.labelled(t, "a dead letter being approved")
	run("confirm the approval",
		chromedp.Click(chromedp.ID("approve")), chromedp.WaitVisible(chromedp.ID("confirm-yes")), chromedp.Click(chromedp.ID("confirm-yes")),
		poll(`document.querySelector('h1 .badge').textContent === 'approved'`))
	if state := letterState(t, base, tok, id); state != "approved" {
		t.Fatalf("%s is %s after the approval", id, state)
	}

	// Replayed, followed to its end.
	run("replay it", chromedp.Click(chromedp.ID("replay-this")), chromedp.WaitVisible(chromedp.ID("replay-form")),
		poll(`document.querySelector('#replay-ids').textContent === `+jsString(id)),
		chromedp.SetValue(chromedp.ID("r-rate"), "5"), chromedp.SetValue(chromedp.ID("r-why"), "catalogue fix"),
		chromedp.Click(chromedp.ID("r-start")), chromedp.WaitVisible(chromedp.ID("confirm-yes")), chromedp.Click(chromedp.ID("confirm-yes")),
		poll(`location.hash.startsWith('#/replay/')`),
		poll(`document.querySelector('#replay-state') && document.querySelector('#replay-state').textContent === 'completed'`),
		poll(`document.querySelector('#replay-handled') && document.querySelector('#replay-handled').textContent === '1'`))
	if !slices.Contains(app.bodies(), repaired) {
		t.Fatalf("the app never received the repaired body; it got %q", app.bodies())
	}
	b.labelled(t, "a replay")

	// The event's timeline.
	run("event lookup", chromedp.Navigate(base+"/ui/#/events?source=orders&event=bad-2"),
		poll(`document.querySelector('#event-out') && document.querySelector('#event-out').textContent.includes('Original')`),
		poll(`document.querySelectorAll('#event-out tbody tr').length > 2`))
	b.labelled(t, "event lookup")

	// A phone's width: nothing wider than the screen.
	for _, page := range []string{"#/", "#/deadletters", "#/deadletter/" + id, "#/replays"} {
		run("at a phone's width: "+page, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile),
			chromedp.Navigate(base+"/ui/"+page), poll(`document.querySelector('#view h1') !== null`))
		if wide := eval(`String(document.documentElement.scrollWidth > window.innerWidth + 1)`); wide != "false" {
			t.Errorf("%s is wider than a phone's screen", page)
		}
	}
	b.noErrors(t)
}

// letterState is a dead letter's state, read through the admin API.
func letterState(t *testing.T, base, tok, id string) string {
	t.Helper()
	var l struct {
		State string `json:"state"`
	}
	if err := getJSON(base+"/v1/deadletters/"+id, tok, &l); err != nil {
		t.Fatal(err)
	}
	return l.State
}

func getJSON(url, tok string, out any) error {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		return fmt.Errorf("%s: %d %s", url, res.StatusCode, b)
	}
	return json.NewDecoder(res.Body).Decode(out)
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// app answers 422 (permanent) to a body naming bad-sku and 200 to the rest,
// and keeps every body it was given.
type app struct {
	url string
	mu  sync.Mutex
	got []string
}

func newApp(t *testing.T) *app {
	a := &app{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /events", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.got = append(a.got, string(body))
		a.mu.Unlock()
		if strings.Contains(string(body), "bad-sku") {
			http.Error(w, "unknown sku", http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	a.url = srv.URL + "/events"
	return a
}

func (a *app) bodies() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got)
}

// startSidecar runs a sidecar on a queue of its own on the local RabbitMQ,
// with the admin API on a free port, until the test ends.
func startSidecar(t *testing.T, appURL, tok string) (*sidecar.Sidecar, config.Config) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	q := "test.console." + hex.EncodeToString(b[:])
	declare := true
	cfg := config.Default()
	cfg.Handler.URL = appURL
	cfg.Sources = []config.Source{{Name: "orders", RabbitMQ: &config.RabbitMQ{URL: brokertest.RabbitURL(), Queue: q, Prefetch: 16, Declare: &declare}}}
	cfg.Retry.MaxAttempts = 2
	cfg.Retry.Tiers = []config.Duration{config.Duration(time.Second)}
	cfg.Journal.Path = filepath.Join(t.TempDir(), "handoff.db")
	cfg.DeadLetter.Poll = config.Duration(200 * time.Millisecond)
	cfg.Admin.Listen = "127.0.0.1:0"
	cfg.Admin.Token = tok
	cfg.Admin.TokenName = "console-test"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQueues(q, cfg.Retry.Tiers) })
	if _, err := sidecar.Declare(context.Background(), cfg, "orders", 1); err != nil {
		t.Fatal(err)
	}
	s, err := sidecar.Build(cfg, sidecar.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Serve(t, s.Run)
	return s, cfg
}

func deleteQueues(q string, tiers []config.Duration) {
	conn, err := amqp.Dial(brokertest.RabbitURL())
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	names := []string{q, rabbitmq.RetryQueue(q), rabbitmq.DeadLetterQueue(q), rabbitmq.LedgerQueue(q)}
	for _, tier := range tiers {
		names = append(names, rabbitmq.TierQueue(q, tier.D()))
	}
	for _, n := range names {
		_, _ = ch.QueueDelete(n, false, false, false)
	}
}

// void drops an action's value.
func void[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, t)
		return chromedp.Void{}, err
	}
}

// browser is a headless Chromium tab, with what its page logged as an
// error.
type browser struct {
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

func newBrowser(t *testing.T, chrome string) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chrome), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800),
		// This machine's network is closed: no calls home.
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	b := &browser{ctx: ctx}
	messages := chromedp.Console(ctx)
	read := make(chan struct{})
	go func() {
		defer close(read)
		for m, err := range messages {
			if err != nil {
				return
			}
			// A refused call (the wrong token's 401) is the network's entry,
			// not the page's; the page's script errors, its exceptions and
			// the CSP's refusals are not.
			if (m.Type == chromedp.ConsoleError || m.IsException()) && m.Source != "network" {
				b.mu.Lock()
				b.errs = append(b.errs, m.String())
				b.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); cancelAlloc(); <-read })
	return b
}

// errors is what the page logged as an error so far.
func (b *browser) errors() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.errs, "; ")
}

// noErrors fails t with what the page logged as an error.
func (b *browser) noErrors(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.errs) > 0 {
		t.Errorf("the page logged errors:\n%s", strings.Join(b.errs, "\n"))
	}
}

// labelled fails t with each visible control that has no label: an input
// without a <label> or aria-label, a button without text.
func (b *browser) labelled(t *testing.T, where string) {
	t.Helper()
	missing, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('input, select, textarea, button')]
		.filter((e) => e.offsetParent !== null || e.closest('dialog[open]'))
		.filter((e) => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !(e.tagName === 'BUTTON' && e.textContent.trim()))
		.map((e) => e.outerHTML.slice(0, 120))`))
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Errorf("%s: controls without a label:\n%s", where, strings.Join(missing, "\n"))
	}
}

// screenshot writes the whole page, 1280 wide, to docs/name with -update.
func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	if !testkit.Update() {
		return
	}
	if err := chromedp.Do(b.ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("..", "..", "docs", name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}
