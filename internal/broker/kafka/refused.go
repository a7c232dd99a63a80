package kafka

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"

	"handoff.dev/handoff/internal/broker"
)

// Refusal reports whether err is the brokers refusing the sidecar: SASL
// credentials or mechanism, a missing permission, or a TLS handshake that
// failed on a certificate. Retrying does not mend it; it says what to check.
func Refusal(err error) (string, bool) {
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return "SASL authentication failed: check sasl.username and the password", true
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return "the brokers do not offer this SASL mechanism: check sasl.mechanism", true
	case errors.Is(err, kerr.IllegalSaslState):
		return "the brokers broke off the SASL exchange: is this listener SASL at all?", true
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.GroupAuthorizationFailed),
		errors.Is(err, kerr.ClusterAuthorizationFailed), errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return "the brokers deny this user an operation the sidecar needs (see the error): grant it in the ACLs", true
	}
	return broker.TLSRefusal(err)
}
