package dev

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/broker/kafka"
)

func produce(ctx context.Context, brokers []string, messages int, every time.Duration, acct *account) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		acct.line("producer: %v", err)
		return
	}
	defer cl.Close()
	t := time.NewTicker(every)
	defer t.Stop()
	for i := range messages {
		o := order{ID: fmt.Sprintf("order-%04d", i+1), Kind: kindOf(i, !acct.demo)}
		if !publish(ctx, cl, o, acct) {
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
	resend(ctx, cl, acct)
}

// resend publishes the first order again, with the same ce-id, once the
// app has handled it: a producer's resend, which the journal does not settle
// for the app (it is a new message), so the app's own idempotency shows.
func resend(ctx context.Context, cl *kgo.Client, acct *account) {
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
	publish(ctx, cl, order{ID: id, Kind: kindOf(0, true)}, acct)
}

// publish produces order o, keyed and ce-id'd by its id, and reports
// whether it was produced.
func publish(ctx context.Context, cl *kgo.Client, o order, acct *account) bool {
	body, _ := json.Marshal(o)
	rec := &kgo.Record{Topic: Topic, Key: []byte(o.ID), Value: body, Headers: []kgo.RecordHeader{
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

// watch reports each dead letter with its reason and, for an app of the
// user's own (whose answers the account does not see), each retry copy with
// the answer that made it: the sidecar's own record of what it did.
func watch(ctx context.Context, brokers []string, acct *account) {
	dlq := kafka.DeadLetterTopic(Topic, Group)
	topics := []string{dlq}
	if !acct.demo {
		topics = append(topics, kafka.RetryTopic(Topic, Group, time.Second), kafka.RetryTopic(Topic, Group, 3*time.Second))
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
