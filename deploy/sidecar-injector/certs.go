package main

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// runCerts is `sidecar-injector certs`: a CA and the serving certificate
// it signs for the injector's Service, written as tls.crt, tls.key,
// ca.crt (the bundle the webhook's caBundle trusts) and ca.key, which the
// manifests' kustomization reads (all but ca.key, which stays here). For a
// cluster that renews certificates by itself, use cert-manager instead and
// point the Secret and the caBundle at what it issues.
//
// Run again, it keeps the CA and issues a new serving certificate: the
// caBundle does not change, so the API server trusts the injector's
// certificate before, during and after the Secret's update reaches it.
// With -rotate-ca it makes a new CA and bundles it with the old one, so
// the API server trusts both while the injectors switch; -prune then
// drops every CA but the current one from the bundle.
func runCerts(args []string) error {
	fs := flag.NewFlagSet("sidecar-injector certs", flag.ContinueOnError)
	out := fs.String("out", "deploy/sidecar-injector/manifests/tls", "directory to write tls.crt, tls.key, ca.crt and ca.key into")
	service := fs.String("service", "handoff-injector", "the injector's Service")
	namespace := fs.String("namespace", "handoff-system", "its namespace")
	var o certOptions
	fs.DurationVar(&o.validity, "validity", 365*24*time.Hour, "how long the serving certificate is valid")
	fs.DurationVar(&o.caValidity, "ca-validity", 10*365*24*time.Hour, "how long a new CA is valid")
	fs.BoolVar(&o.rotateCA, "rotate-ca", false, "make a new CA, bundled in ca.crt with the old one until -prune")
	fs.BoolVar(&o.prune, "prune", false, "drop every CA but the current one from ca.crt (once every injector serves a certificate it signed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	did, err := writeCerts(*out, serviceNames(*service, *namespace), o)
	if err != nil {
		return err
	}
	fmt.Printf("%s: wrote %s/{tls.crt,tls.key,ca.crt,ca.key} for %s.%s.svc, valid %v\n", did, *out, *service, *namespace, o.validity)
	return nil
}

// certOptions are what `certs` is asked to do.
type certOptions struct {
	validity, caValidity time.Duration
	rotateCA, prune      bool
}

// serviceNames are the DNS names the API server may call a Service by.
func serviceNames(service, namespace string) []string {
	return []string{service, service + "." + namespace, service + "." + namespace + ".svc", service + "." + namespace + ".svc.cluster.local"}
}

// writeCerts writes a serving certificate for names into dir, signed by
// the CA in dir (ca.crt's first certificate, its key ca.key), or by a new
// one when there is none or o.rotateCA. A new CA is bundled in ca.crt
// before the CAs there still valid, unless o.prune. It returns what it
// did, for a person.
func writeCerts(dir string, names []string, o certOptions) (string, error) {
	if o.caValidity == 0 {
		o.caValidity = 10 * o.validity
	}
	now := time.Now()
	bundle, err := readCertificates(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return "", err
	}
	caKey, err := readKey(filepath.Join(dir, "ca.key"))
	if err != nil {
		return "", err
	}
	var ca *x509.Certificate
	did := "kept the CA, issued a new serving certificate"
	if len(bundle) > 0 && caKey != nil && !o.rotateCA {
		ca = bundle[0]
		if !samePublicKey(ca.PublicKey, caKey.Public()) {
			return "", fmt.Errorf("%s: ca.key is not the key of ca.crt's first certificate", dir)
		}
		if ca.NotAfter.Before(now.Add(o.validity)) {
			return "", fmt.Errorf("%s: the CA expires %s, before a certificate valid %v would: run certs -rotate-ca", dir, ca.NotAfter.Format(time.RFC3339), o.validity)
		}
	} else {
		if caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber:          serial(),
			Subject:               pkix.Name{CommonName: "handoff sidecar injector CA " + now.UTC().Format("2006-01-02")},
			NotBefore:             now.Add(-time.Hour),
			NotAfter:              now.Add(max(o.caValidity, o.validity)),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
			BasicConstraintsValid: true,
			IsCA:                  true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, caKey.Public(), caKey)
		if err != nil {
			return "", err
		}
		if ca, err = x509.ParseCertificate(der); err != nil {
			return "", err
		}
		// The CAs before it stay trusted while the injectors still serve
		// certificates they signed.
		var kept []*x509.Certificate
		for _, c := range bundle {
			if now.Before(c.NotAfter) {
				kept = append(kept, c)
			}
		}
		bundle = append([]*x509.Certificate{ca}, kept...)
		did = fmt.Sprintf("made a new CA, bundled with %d before it", len(kept))
	}
	if o.prune {
		bundle = bundle[:1]
		did += "; pruned the bundle to the current CA"
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	leaf := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(o.validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, key.Public(), caKey)
	if err != nil {
		return "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", err
	}
	caKeyDER, err := x509.MarshalPKCS8PrivateKey(caKey)
	if err != nil {
		return "", err
	}
	var bundlePEM []byte
	for _, c := range bundle {
		bundlePEM = append(bundlePEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// The CA first: the bundle that trusts the new certificate is in place
	// before the certificate is.
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{"ca.key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: caKeyDER}), 0o600},
		{"ca.crt", bundlePEM, 0o644},
		{"tls.key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600},
		{"tls.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), 0o644},
	} {
		// Written aside and renamed: a running injector never reads half a file.
		tmp := filepath.Join(dir, "."+f.name+".tmp")
		if err := os.WriteFile(tmp, f.data, f.mode); err != nil {
			return "", err
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			return "", err
		}
	}
	return did, nil
}

// readCertificates reads every certificate of a PEM file; none when it
// does not exist.
func readCertificates(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no certificate in it", path)
	}
	return out, nil
}

// readKey reads a PKCS #8 private key; nil when the file does not exist
// (a directory from before the CA's key was kept).
func readKey(path string) (crypto.Signer, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, fmt.Errorf("%s: not PEM", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: a %T cannot sign", path, k)
	}
	return s, nil
}

func samePublicKey(a, b crypto.PublicKey) bool {
	da, err1 := x509.MarshalPKIXPublicKey(a)
	db, err2 := x509.MarshalPKIXPublicKey(b)
	return err1 == nil && err2 == nil && bytes.Equal(da, db)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
