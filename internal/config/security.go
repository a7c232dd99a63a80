package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// TLS configures a TLS connection to a broker. Its presence turns TLS on for
// Kafka (`tls: {}` trusts the system's roots); RabbitMQ takes it with an
// amqps:// URL.
type TLS struct {
	// CAFile holds the PEM certificates that may sign the brokers'; empty
	// means the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the PEM client certificate and its key, for
	// brokers that ask for one. Both or neither. They are read again for
	// every new connection, so a rotated pair is taken up without a restart.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the brokers' certificates are checked against;
	// empty means the host dialled.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any certificate the brokers show. For a
	// test bench only: it is logged as a warning.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Credentials are a user name and password, each inline, from a file (a
// mounted Secret) or from an environment variable; one source for each.
// Files and variables are read again for every new connection, so a rotated
// password is taken up at the next reconnect.
type Credentials struct {
	Username     string `yaml:"username"`
	UsernameFile string `yaml:"username_file"`
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	PasswordEnv  string `yaml:"password_env"`
}

// SASL authenticates a Kafka client.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism   string `yaml:"mechanism"`
	Credentials `yaml:",inline"`
}

// SASL mechanisms the Kafka source speaks.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// IsSet reports whether any credential is configured.
func (c *Credentials) IsSet() bool {
	return c != nil && (c.Username != "" || c.UsernameFile != "" || c.HasPassword())
}

// HasPassword reports whether a password source is configured.
func (c *Credentials) HasPassword() bool {
	return c.Password != "" || c.PasswordFile != "" || c.PasswordEnv != ""
}

// User reads the user name from where it is configured.
func (c *Credentials) User() (string, error) {
	if c.UsernameFile != "" {
		u, err := readSecretFile(c.UsernameFile)
		if err != nil {
			return "", fmt.Errorf("username_file: %w", err)
		}
		return u, nil
	}
	return c.Username, nil
}

// Secret reads the password from where it is configured.
func (c *Credentials) Secret() (string, error) {
	switch {
	case c.PasswordFile != "":
		p, err := readSecretFile(c.PasswordFile)
		if err != nil {
			return "", fmt.Errorf("password_file: %w", err)
		}
		return p, nil
	case c.PasswordEnv != "":
		if v := os.Getenv(c.PasswordEnv); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("password_env: $%s is not set or empty", c.PasswordEnv)
	}
	return c.Password, nil
}

// readSecretFile reads a one-line secret: a trailing newline, which most
// ways of writing a file add, is not part of it.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

func (c *Credentials) validate(path string, ps *Problems) {
	if c.Username != "" && c.UsernameFile != "" {
		ps.add(path+".username_file", "set username or username_file, not both")
	}
	n := 0
	for _, s := range []string{c.Password, c.PasswordFile, c.PasswordEnv} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		ps.add(path+".password", "set one of password, password_file and password_env")
		return
	}
	for _, f := range []struct{ key, file string }{{"username_file", c.UsernameFile}, {"password_file", c.PasswordFile}} {
		if f.file == "" {
			continue
		}
		if _, err := readSecretFile(f.file); err != nil {
			ps.add(path+"."+f.key, "%s", err)
		}
	}
	if c.PasswordEnv != "" && os.Getenv(c.PasswordEnv) == "" {
		ps.add(path+".password_env", "$%s is not set or empty", c.PasswordEnv)
	}
}

func (t *TLS) validate(path string, ps *Problems) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		ps.add(path+".cert_file", "cert_file and key_file go together: set both or neither")
	}
	if _, err := t.ClientConfig(); err != nil {
		var pe *tlsFileError
		if errors.As(err, &pe) {
			ps.add(path+"."+pe.key, "%s", pe.err)
		} else {
			ps.add(path, "%s", err)
		}
	}
}

// tlsFileError names the key whose file could not be used.
type tlsFileError struct {
	key string
	err error
}

func (e *tlsFileError) Error() string { return e.key + ": " + e.err.Error() }
func (e *tlsFileError) Unwrap() error { return e.err }

// ClientConfig builds the tls.Config that TLS describes. The client
// certificate is read from its files at every handshake.
func (t *TLS) ClientConfig() (*tls.Config, error) {
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // asked for, and logged
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &tlsFileError{"ca_file", err}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &tlsFileError{"ca_file", fmt.Errorf("%s holds no PEM certificate", t.CAFile)}
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" && t.KeyFile != "" {
		if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			return nil, &tlsFileError{"cert_file", err}
		}
		certFile, keyFile := t.CertFile, t.KeyFile
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			pair, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("client certificate %s: %w", certFile, err)
			}
			return &pair, nil
		}
	}
	return c, nil
}

func (s *SASL) validate(path string, ps *Problems) {
	switch s.Mechanism {
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
	case "":
		ps.add(path+".mechanism", "required: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
	default:
		ps.add(path+".mechanism", "want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, got %q", s.Mechanism)
	}
	if s.Username == "" && s.UsernameFile == "" {
		ps.add(path+".username", "required (or username_file)")
	}
	if !s.HasPassword() {
		ps.add(path+".password_file", "a password is required: password_file, password_env or password")
	}
	s.Credentials.validate(path, ps)
}

// validateSecurity checks a RabbitMQ source's TLS and credentials against
// its URL.
func (r *RabbitMQ) validateSecurity(path string, u *url.URL, ps *Problems) {
	if r.TLS != nil {
		if u != nil && u.Scheme != "amqps" {
			ps.add(path+".tls", "applies to an amqps:// url; the url is %s://", u.Scheme)
		}
		r.TLS.validate(path+".tls", ps)
	}
	if r.Credentials.IsSet() {
		if r.Username == "" && r.UsernameFile == "" {
			ps.add(path+".username", "required with a password (or username_file)")
		}
		if !r.HasPassword() {
			ps.add(path+".password_file", "a password is required with a username: password_file, password_env or password")
		}
		r.Credentials.validate(path, ps)
		if u != nil && u.User != nil {
			ps.add(path+".url", "holds a user as well as %s.username: keep the credentials in one place", path)
		}
	}
}
