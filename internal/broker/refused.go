package broker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
)

// TLSRefusal reports whether err is a TLS handshake that failed on who is
// who: a broker certificate the sidecar does not trust, a client
// certificate the broker did not accept, or a port that does not speak TLS.
// It returns what to check. Retrying such a failure does not mend it, so it
// is logged as an error that names it, not as a passing warning.
func TLSRefusal(err error) (string, bool) {
	var (
		verify  *tls.CertificateVerificationError
		host    x509.HostnameError
		unknown x509.UnknownAuthorityError
		invalid x509.CertificateInvalidError
		alert   tls.AlertError
		remote  *net.OpError
		header  tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &host):
		return "the broker's certificate is not for the host dialled: set tls.server_name to a name it holds", true
	case errors.As(err, &unknown), errors.As(err, &invalid), errors.As(err, &verify):
		return "the broker's certificate is not trusted: check tls.ca_file", true
	case errors.As(err, &alert):
		return fmt.Sprintf("the broker ended the TLS handshake (%v): check tls.cert_file and tls.key_file", error(alert)), true
	case errors.As(err, &remote) && remote.Op == "remote error":
		// A TLS alert from the peer: crypto/tls reports one so.
		return fmt.Sprintf("the broker ended the TLS handshake (%v): check tls.cert_file and tls.key_file", remote.Err), true
	case errors.As(err, &header):
		return "the broker does not speak TLS on this port", true
	}
	return "", false
}
