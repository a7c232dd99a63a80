package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker/kafka"
)

// The baselines are the consumers a team would write on the raw client
// library without Handoff: prefetch (or a poll loop), a pool of workers
// posting to the app over pooled keep-alive connections, ack (or commit) on
// 2xx. They run as their own processes so that their CPU and memory are
// measured the same way as the sidecar's.

func appClient(workers int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConns: workers, MaxIdleConnsPerHost: workers}}
}

func post(c *http.Client, url, id string, body []byte) bool { return postSent(c, url, id, "", body) }

// postSent posts like post, passing sent on as X-Sent (for latency runs).
func postSent(c *http.Client, url, id, sent string, body []byte) bool {
	return postWith(c, url, id, sent, body, nil)
}

// postWith posts like postSent, with headers besides; with a Ce-Id among
// them when given any, instead of X-Id.
func postWith(c *http.Client, url, id, sent string, body []byte, headers http.Header) bool {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	if headers != nil {
		for k, v := range headers {
			req.Header[k] = v
		}
		req.Header.Set("Ce-Id", id)
	} else {
		req.Header.Set("X-Id", id)
	}
	if sent != "" {
		req.Header.Set("X-Sent", sent)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode/100 == 2
}

func runBaselineRabbit(args []string) error {
	fs := flag.NewFlagSet("baseline-rabbit", flag.ContinueOnError)
	url := fs.String("url", "", "AMQP URL")
	queue := fs.String("queue", "", "queue")
	app := fs.String("app", "", "app URL")
	workers := fs.Int("workers", 64, "workers")
	prefetch := fs.Int("prefetch", 256, "prefetch")
	if err := fs.Parse(args); err != nil {
		return err
	}
	conn, err := amqp.Dial(*url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(*prefetch, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(*queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	client := appClient(*workers)
	var wg sync.WaitGroup
	for range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range deliveries {
				sent, _ := d.Headers["x-sent"].(string)
				if postSent(client, *app, d.MessageId, sent, d.Body) {
					_ = d.Ack(false)
				} else {
					_ = d.Nack(false, true)
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

func runBaselineKafka(args []string) error {
	fs := flag.NewFlagSet("baseline-kafka", flag.ContinueOnError)
	brokers := fs.String("brokers", "", "brokers")
	topic := fs.String("topic", "", "topic")
	group := fs.String("group", "", "group")
	app := fs.String("app", "", "app URL")
	workers := fs.Int("workers", 64, "workers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(*brokers), kgo.ConsumerGroup(*group), kgo.ConsumeTopics(*topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AutoCommitMarks())
	if err != nil {
		return err
	}
	defer cl.Close()
	return pollAndPost(cl, *workers, *app, func(*kgo.Record) {}, func(recs []*kgo.Record) { cl.MarkCommitRecords(recs...) })
}

// runBaselineKafkaShare is the hand-written share-group consumer: each
// poll's records to the workers, each accepted once the app answered 2xx,
// the next poll once every record of the last is (the client would accept
// the rest at it). The group is set to start at the earliest record first.
func runBaselineKafkaShare(args []string) error {
	fs := flag.NewFlagSet("baseline-kafka-share", flag.ContinueOnError)
	brokers := fs.String("brokers", "", "brokers")
	topic := fs.String("topic", "", "topic")
	group := fs.String("group", "", "share group")
	app := fs.String("app", "", "app URL")
	workers := fs.Int("workers", 64, "workers")
	max := fs.Int("max-records", 128, "records a poll")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(*brokers), kgo.ShareGroup(*group), kgo.ConsumeTopics(*topic),
		kgo.ShareMaxRecords(int32(*max)), kgo.ShareMaxRecordsStrict())
	if err != nil {
		return err
	}
	defer cl.Close()
	// As the sidecar's declare does: Kafka's default would skip the
	// preloaded records.
	if err := kafka.SetGroupConfig(context.Background(), cl, *group, "share.auto.offset.reset", "earliest"); err != nil {
		return err
	}
	return pollAndPost(cl, *workers, *app, func(r *kgo.Record) { r.Ack(kgo.AckAccept) }, func([]*kgo.Record) {})
}

// pollAndPost is a hand-written baseline's poll loop: each poll's records
// to the workers, done called for each once the app answered 2xx, after
// with the poll's records once all are, then the next poll.
func pollAndPost(cl *kgo.Client, workers int, app string, done func(*kgo.Record), after func([]*kgo.Record)) error {
	work := make(chan *kgo.Record)
	var batch sync.WaitGroup
	postRecords(workers, app, work, func(r *kgo.Record) { done(r); batch.Done() })
	ctx := context.Background()
	for {
		f := cl.PollFetches(ctx)
		if f.IsClientClosed() {
			return nil
		}
		recs := f.Records()
		batch.Add(len(recs))
		for _, r := range recs {
			work <- r
		}
		batch.Wait()
		after(recs)
	}
}

// postRecords starts workers that post each record of work to the app until
// it answers 2xx, then call done with it.
func postRecords(workers int, app string, work <-chan *kgo.Record, done func(*kgo.Record)) {
	client := appClient(workers)
	for range workers {
		go func() {
			for r := range work {
				var sent string
				for _, h := range r.Headers {
					if h.Key == "x-sent" {
						sent = string(h.Value)
					}
				}
				for !postSent(client, app, string(r.Key), sent, r.Value) {
				}
				done(r)
			}
		}()
	}
}

// profileEnv names the file a baseline writes its CPU profile to, when set.
const profileEnv = "HANDOFF_BENCH_CPU_PROFILE"

// profiled runs a baseline or the app, under a CPU profile when profileEnv
// asks for one. The harness stops them with SIGTERM: the profile is written
// then.
func profiled(run func([]string) error, args []string) error {
	path := os.Getenv(profileEnv)
	if path == "" {
		return run(args)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	stop := func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- run(args) }()
	select {
	case err = <-done:
	case <-sig:
	}
	stop()
	return err
}
