package sidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"handoff.dev/handoff/internal/broker/rabbitmq"
	"handoff.dev/handoff/internal/config"
	"handoff.dev/handoff/internal/redact"
)

// What `sidecar declare` and `sidecar publish` do for a first run: create
// the queue or topic a source consumes, and send it test messages, through
// the connection its config block describes (TLS and credentials too).

// Declared says what Declare did of one source.
type Declared struct {
	Source, Broker, Name string
	// Created is false when it was there already.
	Created bool
}

// Declare creates the queue (a quorum queue) or the topic (of partitions
// partitions, the brokers' replication) that source consumes, when it is
// missing. The sidecar declares the rest of its topology itself at start.
func Declare(ctx context.Context, cfg config.Config, source string, partitions int32) (Declared, error) {
	sc, err := sourceNamed(cfg, source)
	if err != nil {
		return Declared{}, err
	}
	switch {
	case sc.RabbitMQ != nil:
		r := sc.RabbitMQ
		d := Declared{Source: sc.Name, Broker: "rabbitmq", Name: r.Queue}
		conn, err := dialRabbit(sc.Name, r)
		if err != nil {
			return d, err
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return d, err
		}
		if _, err := ch.QueueDeclarePassive(r.Queue, true, false, false, false, nil); err == nil {
			return d, nil
		}
		// A passive declare of a missing queue closes its channel.
		if ch, err = conn.Channel(); err != nil {
			return d, err
		}
		defer ch.Close()
		_, err = ch.QueueDeclare(r.Queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
		d.Created = err == nil
		return d, err
	case sc.Kafka != nil:
		k := sc.Kafka
		d := Declared{Source: sc.Name, Broker: "kafka", Name: k.Topic}
		cl, err := kafkaClient(sc.Name, k)
		if err != nil {
			return d, err
		}
		defer cl.Close()
		resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, -1, nil, k.Topic)
		if err == nil {
			err = resp.Err
		}
		if errors.Is(err, kerr.TopicAlreadyExists) {
			return d, nil
		}
		d.Created = err == nil
		return d, err
	}
	return Declared{}, fmt.Errorf("source %q: no broker configured", sc.Name)
}

// Message is one test message for Publish.
type Message struct {
	ID, ContentType string
	Body            []byte
}

// Publish sends msgs to the queue or topic source consumes, and returns once
// the broker has confirmed each. Each carries its id as the message id
// (RabbitMQ) or ce_id header (Kafka): the event id the app is given.
func Publish(ctx context.Context, cfg config.Config, source string, msgs []Message) error {
	sc, err := sourceNamed(cfg, source)
	if err != nil {
		return err
	}
	switch {
	case sc.RabbitMQ != nil:
		conn, err := dialRabbit(sc.Name, sc.RabbitMQ)
		if err != nil {
			return err
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			return err
		}
		// Published mandatory: a message no queue takes (the queue not
		// declared) comes back, before its confirm, rather than vanishing.
		returned := ch.NotifyReturn(make(chan amqp.Return, len(msgs)))
		var confirms []*amqp.DeferredConfirmation
		for _, m := range msgs {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", sc.RabbitMQ.Queue, true, false, amqp.Publishing{
				MessageId: m.ID, ContentType: m.ContentType, Body: m.Body, DeliveryMode: amqp.Persistent, Timestamp: time.Now(),
			})
			if err != nil {
				return err
			}
			confirms = append(confirms, dc)
		}
		for i, dc := range confirms {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%s: the broker refused message %s", sc.RabbitMQ.Queue, msgs[i].ID)
			}
		}
		select {
		case r := <-returned:
			return fmt.Errorf("queue %s took no message (%s): sidecar declare creates it", sc.RabbitMQ.Queue, r.ReplyText)
		default:
			return nil
		}
	case sc.Kafka != nil:
		cl, err := kafkaClient(sc.Name, sc.Kafka)
		if err != nil {
			return err
		}
		defer cl.Close()
		recs := make([]*kgo.Record, len(msgs))
		for i, m := range msgs {
			recs[i] = &kgo.Record{Topic: sc.Kafka.Topic, Key: []byte(m.ID), Value: m.Body, Headers: []kgo.RecordHeader{
				{Key: "ce_id", Value: []byte(m.ID)}, {Key: "content-type", Value: []byte(m.ContentType)}}}
		}
		return cl.ProduceSync(ctx, recs...).FirstErr()
	}
	return fmt.Errorf("source %q: no broker configured", sc.Name)
}

// sourceNamed is cfg's source of that name; "" names the only one.
func sourceNamed(cfg config.Config, name string) (config.Source, error) {
	if name == "" && len(cfg.Sources) == 1 {
		return cfg.Sources[0], nil
	}
	var names []string
	for _, sc := range cfg.Sources {
		if sc.Name == name {
			return sc, nil
		}
		names = append(names, sc.Name)
	}
	if name == "" {
		return config.Source{}, configError(fmt.Errorf("--source: the config has %d sources, name one of %q", len(names), names))
	}
	return config.Source{}, configError(fmt.Errorf("--source: no source %q in the config (it has %q)", name, names))
}

// dialRabbit connects as a RabbitMQ source does, with its TLS and login.
func dialRabbit(name string, r *config.RabbitMQ) (*amqp.Connection, error) {
	var tlsConfig *tls.Config
	if r.TLS != nil {
		var err error
		if tlsConfig, err = r.TLS.ClientConfig(); err != nil {
			return nil, fmt.Errorf("source %s: tls: %w", name, err)
		}
	}
	conn, err := rabbitmq.Dial("handoff "+name, r.URL, tlsConfig, rabbitLogin(r))
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", name, redact.Error(err))
	}
	return conn, nil
}

// kafkaClient is a plain client of a Kafka source's brokers, with its TLS
// and SASL.
func kafkaClient(name string, k *config.Kafka) (*kgo.Client, error) {
	security, err := kafkaSecurity(name, k, discard)
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.Brokers...), kgo.RequiredAcks(kgo.AllISRAcks())}, security...)...)
}

// discard is the log of a tool's one-off client: its warnings are the
// running sidecar's to give.
var discard = slog.New(slog.NewTextHandler(io.Discard, nil))
