package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/kafka"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/dispatch"
	"handoff.dev/handoff/internal/journal"
	"handoff.dev/handoff/internal/redact"
)

// devTopic is the demo's source topic; the group is devGroup.
const (
	devTopic = "demo.orders"
	devGroup = "demo"
)

func devCmd() *cobra.Command {
	var o devOptions
	cmd := &cobra.Command{
		Use:   "dev",
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
orders a request (CloudEvents batched mode).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.handler != "http" && o.handler != "grpc" {
				return &exitError{code: exitConfig, err: fmt.Errorf("--handler: want http or grpc, got %q", o.handler)}
			}
			if o.batch > 1 && o.app == "" {
				// The demo apps answer one order a request.
				return &exitError{code: exitConfig, err: errors.New("--batch: only with --app")}
			}
			return runDev(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().IntVar(&o.messages, "messages", 30, "orders to produce")
	cmd.Flags().DurationVar(&o.every, "every", 250*time.Millisecond, "time between orders")
	cmd.Flags().BoolVar(&o.untilEnd, "exit-when-done", false, "exit once every order is handled or dead-lettered")
	cmd.Flags().StringVar(&o.handler, "handler", "http", "the demo app's transport: http or grpc")
	cmd.Flags().StringVar(&o.app, "app", "", "hand the orders to the app at this URL instead of the demo app (http://, grpc://, ...)")
	cmd.Flags().IntVar(&o.batch, "batch", 1, "with --app, hand the app up to this many orders a request (handler.batch.max_messages)")
	cmd.Flags().StringVar(&o.admin, "admin", "127.0.0.1:0", "serve the admin API here (a free port by default), with a token made for the run; \"\" turns it off")
	return cmd
}

// devOptions are sidecar dev's flags.
type devOptions struct {
	messages int
	every    time.Duration
	untilEnd bool
	handler  string // the demo app's transport
	app      string // an app of the user's own, instead of the demo app
	batch    int    // handler.batch.max_messages
	admin    string // the admin API's address; "" turns it off
}

// devOrder is the demo's message body.
type devOrder struct {
	ID   string `json:"id"`
	Kind string `json:"kind"` // ok, flaky, early, bad, down
}

// devKind is the kind of the i-th order (from 0). Only an app of the user's
// own gets early orders, whose precondition it finds unmet at first: the
// demo app's answers stay what they have always been.
func devKind(i int, app bool) string {
	switch {
	case i%10 == 4:
		return "bad"
	case i%12 == 10:
		return "down"
	case i%5 == 2:
		return "flaky"
	case app && i%7 == 5:
		return "early"
	}
	return "ok"
}

func runDev(ctx context.Context, out io.Writer, o devOptions) error {
	messages := o.messages
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, devTopic))
	if err != nil {
		return fmt.Errorf("embedded kafka: %w", err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	dir, err := os.MkdirTemp("", "handoff-dev-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	acct := &devAccount{out: out, start: time.Now(), state: map[string]string{}, demo: o.app == ""}
	if !acct.demo && messages > 0 {
		acct.again = againWaiting
	}
	appURL, appAddr := o.app, redact.URL(o.app)
	var hk hooks
	adminAddr := make(chan string, 1)
	switch {
	case o.app != "":
		// Your own app: the account learns what it handled from the sidecar.
		hk.fault = func(w dispatch.Window, k journal.Key) error {
			if w == dispatch.WindowHandled {
				acct.handled(k.EventID)
			}
			return nil
		}
	case o.handler == "grpc":
		addr, stop, err := startDevGRPCApp(acct)
		if err != nil {
			return err
		}
		defer stop()
		appURL, appAddr = "grpc://"+addr, "grpc://"+addr
	default:
		app, err := startDevApp(acct)
		if err != nil {
			return err
		}
		defer app.Close()
		appURL, appAddr = "http://"+app.Addr+"/events", app.Addr
	}

	cfg := config.Default()
	cfg.Handler.URL = appURL
	cfg.Handler.Timeout = config.Duration(2 * time.Second)
	cfg.Handler.MaxConcurrency = 8
	if o.batch > 1 {
		// Long enough for the orders produced meanwhile to share a request.
		cfg.Handler.Batch = config.Batch{MaxMessages: o.batch, MaxWait: config.Duration(100 * time.Millisecond)}
	}
	declare := true
	cfg.Sources = []config.Source{{Name: "demo", Kafka: &config.Kafka{
		Brokers: brokers, Topic: devTopic, Group: devGroup, Ordering: broker.OrderNone, Declare: &declare, MaxInFlight: 32,
	}}}
	cfg.Retry.MaxAttempts = 4
	cfg.Retry.Tiers = []config.Duration{config.Duration(time.Second), config.Duration(3 * time.Second)}
	cfg.Journal.Path = filepath.Join(dir, "handoff.db")
	cfg.Telemetry.MetricsListen = ""
	cfg.Shutdown.DrainTimeout = config.Duration(5 * time.Second)
	cfg.DeadLetter.Poll = config.Duration(200 * time.Millisecond)
	if o.admin != "" {
		// A token made for the run, so that the dead letters it makes can
		// be listed, repaired and replayed with the CLI.
		tok := make([]byte, 16)
		_, _ = rand.Read(tok)
		cfg.Admin.Listen, cfg.Admin.TokenFile = o.admin, filepath.Join(dir, "admin.token")
		if err := os.WriteFile(cfg.Admin.TokenFile, []byte(hex.EncodeToString(tok)+"\n"), 0o600); err != nil {
			return err
		}
		hk.adminAddr = func(a string) { adminAddr <- a }
	}
	if err := cfg.Validate(); err != nil {
		return err
	}

	if acct.demo {
		fmt.Fprintf(out, "Handoff dev: embedded Kafka at %s, topic %s, demo app at %s\n", brokers[0], devTopic, appAddr)
		fmt.Fprintf(out, "Orders: most succeed; some fail once (busy) then succeed, some are rejected, one keeps failing.\n")
	} else {
		fmt.Fprintf(out, "Handoff dev: embedded Kafka at %s, topic %s, your app at %s\n", brokers[0], devTopic, appAddr)
	}
	fmt.Fprintf(out, "Retry tiers 1s and 3s, max 4 attempts; dead letters go to %s. Ctrl-C to stop.\n\n", kafka.DeadLetterTopic(devTopic, devGroup))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, log, hk) }()
	if o.admin != "" {
		select {
		case a := <-adminAddr:
			fmt.Fprintf(out, "Admin API at %s; in another terminal, while this runs:\n  sidecar dlq list --admin %s --token-file %s\n\n",
				a, a, cfg.Admin.TokenFile)
		case err := <-done:
			return err
		}
	}

	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		devProduce(ctx, brokers, messages, o.every, acct)
	}()
	go func() {
		defer wg.Done()
		devWatch(ctx, brokers, acct)
	}()
	if o.untilEnd {
		go func() {
			for ctx.Err() == nil {
				if acct.finished(messages) {
					cancel()
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	err = <-done
	cancel()
	wg.Wait()
	acct.totals(messages)
	return err
}

// devAccount prints the live account and keeps the totals.
type devAccount struct {
	mu       sync.Mutex
	out      io.Writer
	start    time.Time
	state    map[string]string // id → ok, dead
	calls    int
	produced int
	demo     bool // the demo app answers, and counts the calls
	// again is how far the resend of the first order has got (an app of
	// the user's own only); againID is that order's id.
	again   againState
	againID string
	retried map[string]bool // id/attempt of each retry copy reported
}

// againState is how far the resend of an order already handled has got.
type againState int

const (
	againNone    againState = iota // no resend: the demo app, or nothing to resend
	againWaiting                   // waiting for the first order to be settled
	againSent                      // published again, not yet settled again
)

// called records one call the demo app answered with ans, named by words.
func (a *devAccount) called(id, attempt, words string, ans devAnswer) {
	a.line("%s  attempt %s  → %s %s", id, attempt, words, ans.says)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	if ans.handled {
		a.state[id] = "ok"
	}
}

// handled records that an app of the user's own handled id.
func (a *devAccount) handled(id string) {
	a.mu.Lock()
	again := a.again == againSent && id == a.againID
	a.mu.Unlock()
	if again {
		a.line("%s  resend answered 2xx by the app (its log says whether it did the work twice)", id)
	} else {
		a.line("%s  handled by the app", id)
	}
	a.settled(id, "ok")
}

// settled records id's fate: ok or dead.
func (a *devAccount) settled(id, fate string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.again == againSent && id == a.againID {
		// The resend's own fate; the order's stays the first one's.
		a.again = againNone
		return
	}
	a.state[id] = fate
}

func (a *devAccount) line(format string, args ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	fmt.Fprintf(a.out, "%6.2fs  "+format+"\n", append([]any{time.Since(a.start).Seconds()}, args...)...)
}

func (a *devAccount) finished(messages int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.produced == messages && len(a.state) == messages && a.again == againNone
}

func (a *devAccount) totals(messages int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ok, dead := 0, 0
	for _, s := range a.state {
		if s == "ok" {
			ok++
		} else {
			dead++
		}
	}
	fmt.Fprintf(a.out, "\nTotals: %d produced, %d handled, %d dead-lettered, %d still in flight", a.produced, ok, dead, a.produced-ok-dead)
	if a.demo {
		fmt.Fprintf(a.out, "; %d calls to the app", a.calls)
	}
	fmt.Fprintln(a.out, ".")
}

type devApp struct {
	Addr string
	srv  *http.Server
}

func (d *devApp) Close() { _ = d.srv.Close() }

// startDevApp serves the demo app: it answers by the order's kind and attempt.
func startDevApp(acct *devAccount) (*devApp, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var o devOrder
		body, _ := io.ReadAll(r.Body)
		attempt := r.Header.Get("Handoff-Attempt")
		if err := json.Unmarshal(body, &o); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		n, _ := strconv.Atoi(attempt)
		ans := devDecide(o, n)
		acct.called(o.ID, attempt, strconv.Itoa(ans.status), ans)
		w.WriteHeader(ans.status)
		_, _ = w.Write([]byte(ans.detail))
	})}
	go func() { _ = srv.Serve(ln) }()
	return &devApp{Addr: ln.Addr().String(), srv: srv}, nil
}

func devProduce(ctx context.Context, brokers []string, messages int, every time.Duration, acct *devAccount) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		acct.line("producer: %v", err)
		return
	}
	defer cl.Close()
	t := time.NewTicker(every)
	defer t.Stop()
	for i := range messages {
		o := devOrder{ID: fmt.Sprintf("order-%04d", i+1), Kind: devKind(i, !acct.demo)}
		if !devPublish(ctx, cl, o, acct) {
			return
		}
		acct.mu.Lock()
		acct.produced++
		acct.mu.Unlock()
		acct.line("%s  produced (%s)", o.ID, o.Kind)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	devResend(ctx, cl, acct)
}

// devResend publishes the first order again, with the same ce-id, once the
// app has handled it: a producer's resend, which the journal does not settle
// for the app (it is a new message), so the app's own idempotency shows.
func devResend(ctx context.Context, cl *kgo.Client, acct *devAccount) {
	id := fmt.Sprintf("order-%04d", 1)
	for {
		acct.mu.Lock()
		waiting, fate := acct.again == againWaiting, acct.state[id]
		acct.mu.Unlock()
		if !waiting {
			return
		}
		if fate != "" {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	acct.mu.Lock()
	if acct.state[id] != "ok" {
		acct.again = againNone // a dead letter is not sent again
		acct.mu.Unlock()
		return
	}
	acct.again, acct.againID = againSent, id
	acct.mu.Unlock()
	acct.line("%s  published again with the same ce-id (a producer's resend)", id)
	devPublish(ctx, cl, devOrder{ID: id, Kind: devKind(0, true)}, acct)
}

// devPublish produces order o, keyed and ce-id'd by its id, and reports
// whether it was produced.
func devPublish(ctx context.Context, cl *kgo.Client, o devOrder, acct *devAccount) bool {
	body, _ := json.Marshal(o)
	rec := &kgo.Record{Topic: devTopic, Key: []byte(o.ID), Value: body, Headers: []kgo.RecordHeader{
		{Key: "ce_id", Value: []byte(o.ID)}, {Key: "ce_type", Value: []byte("demo.order")}, {Key: "content-type", Value: []byte("application/json")},
	}}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		if !errors.Is(err, context.Canceled) {
			acct.line("producer: %v", err)
		}
		return false
	}
	return true
}

// devWatch reports each dead letter with its reason and, for an app of the
// user's own (whose answers the account does not see), each retry copy with
// the answer that made it: the sidecar's own record of what it did.
func devWatch(ctx context.Context, brokers []string, acct *devAccount) {
	dlq := kafka.DeadLetterTopic(devTopic, devGroup)
	topics := []string{dlq}
	if !acct.demo {
		topics = append(topics, kafka.RetryTopic(devTopic, devGroup, time.Second), kafka.RetryTopic(devTopic, devGroup, 3*time.Second))
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return
	}
	defer cl.Close()
	for ctx.Err() == nil {
		f := cl.PollFetches(ctx)
		f.EachRecord(func(r *kgo.Record) {
			var id, reason, why, attempt, class string
			for _, h := range r.Headers {
				switch h.Key {
				case broker.HeaderEventID:
					id = string(h.Value)
				case broker.HeaderDeadReason:
					reason = string(h.Value)
				case broker.HeaderError:
					why = string(h.Value)
				case broker.HeaderAttempt:
					attempt = string(h.Value)
				case broker.HeaderErrorClass:
					class = string(h.Value)
				}
			}
			if r.Topic == dlq {
				acct.line("%s  dead-lettered after %s attempt(s): %s (%s)", id, attempt, reason, why)
				acct.settled(id, "dead")
				return
			}
			acct.retry(id, attempt, class, why)
		})
	}
}

// retry reports the retry copy of id made after attempt, once: a copy
// delayed again (it needed a longer wait than its tier) is the same retry.
func (a *devAccount) retry(id, attempt, class, why string) {
	a.mu.Lock()
	if a.retried == nil {
		a.retried = map[string]bool{}
	}
	seen := a.retried[id+"/"+attempt]
	a.retried[id+"/"+attempt] = true
	a.mu.Unlock()
	if seen {
		return
	}
	if class == "defer" {
		a.line("%s  attempt %s  → deferred: tried again later, not counted as a failure (%s)", id, attempt, why)
		return
	}
	a.line("%s  attempt %s  → %s: retried later (%s)", id, attempt, class, why)
}
