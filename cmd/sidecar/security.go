package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"handoff.dev/handoff/internal/config"
)

// clientTLS builds a source's TLS configuration, saying so when it checks
// nothing.
func clientTLS(source string, t *config.TLS, log *slog.Logger) (*tls.Config, error) {
	c, err := t.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("source %s: tls: %w", source, err)
	}
	if t.InsecureSkipVerify {
		log.Warn("tls.insecure_skip_verify is set: any certificate the brokers show is accepted", "source", source)
	}
	return c, nil
}

// rabbitLogin is a RabbitMQ source's login when it has credentials of its
// own: read at each connect, so a rotated password file is taken up.
func rabbitLogin(r *config.RabbitMQ) func() (string, string, error) {
	if !r.Credentials.IsSet() {
		return nil
	}
	creds := r.Credentials
	return func() (string, string, error) {
		user, err := creds.User()
		if err != nil {
			return "", "", err
		}
		password, err := creds.Secret()
		return user, password, err
	}
}

// kafkaSecurity is the client options for a Kafka source's TLS and SASL.
// SASL credentials are read at each new connection, so a rotated password
// file is taken up without a restart.
func kafkaSecurity(source string, k *config.Kafka, log *slog.Logger) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if k.TLS != nil {
		c, err := clientTLS(source, k.TLS, log)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(c))
	}
	if s := k.SASL; s != nil {
		if k.TLS == nil {
			log.Warn("kafka sasl without tls: the exchange, and with PLAIN the password, cross the network in clear", "source", source, "mechanism", s.Mechanism)
		}
		creds := s.Credentials
		login := func() (string, string, error) {
			user, err := creds.User()
			if err != nil {
				return "", "", fmt.Errorf("source %s: sasl: %w", source, err)
			}
			password, err := creds.Secret()
			if err != nil {
				return "", "", fmt.Errorf("source %s: sasl: %w", source, err)
			}
			return user, password, nil
		}
		var m sasl.Mechanism
		switch s.Mechanism {
		case config.SASLPlain:
			m = plain.Plain(func(context.Context) (plain.Auth, error) {
				user, password, err := login()
				return plain.Auth{User: user, Pass: password}, err
			})
		case config.SASLScramSHA256, config.SASLScramSHA512:
			auth := func(context.Context) (scram.Auth, error) {
				user, password, err := login()
				return scram.Auth{User: user, Pass: password}, err
			}
			if s.Mechanism == config.SASLScramSHA256 {
				m = scram.Sha256(auth)
			} else {
				m = scram.Sha512(auth)
			}
		default:
			return nil, fmt.Errorf("source %s: sasl.mechanism %q not supported", source, s.Mechanism)
		}
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}
