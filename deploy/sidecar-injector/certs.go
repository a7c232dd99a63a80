package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// runCerts is `sidecar-injector certs`: a CA and the serving certificate
// it signs for the injector's Service, written as tls.crt, tls.key and
// ca.crt, which the manifests' kustomization reads. For a cluster that
// renews certificates by itself, use cert-manager instead and point the
// Secret and the caBundle at what it issues.
func runCerts(args []string) error {
	fs := flag.NewFlagSet("sidecar-injector certs", flag.ContinueOnError)
	out := fs.String("out", "deploy/sidecar-injector/manifests/tls", "directory to write tls.crt, tls.key and ca.crt into")
	service := fs.String("service", "handoff-injector", "the injector's Service")
	namespace := fs.String("namespace", "handoff-system", "its namespace")
	validity := fs.Duration("validity", 365*24*time.Hour, "how long the certificates are valid")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := writeCerts(*out, serviceNames(*service, *namespace), *validity); err != nil {
		return err
	}
	fmt.Printf("wrote %s/{tls.crt,tls.key,ca.crt} for %s.%s.svc, valid %v\n", *out, *service, *namespace, *validity)
	return nil
}

// serviceNames are the DNS names the API server may call a Service by.
func serviceNames(service, namespace string) []string {
	return []string{service, service + "." + namespace, service + "." + namespace + ".svc", service + "." + namespace + ".svc.cluster.local"}
}

// writeCerts makes a CA and a serving certificate for names, signed by
// it, and writes them into dir: the key readable by its owner only.
func writeCerts(dir string, names []string, validity time.Duration) error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "handoff sidecar injector CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	leaf := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: names[0]},
		DNSNames:     names,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []struct {
		name, kind string
		der        []byte
		mode       os.FileMode
	}{
		{"ca.crt", "CERTIFICATE", caDER, 0o644},
		{"tls.crt", "CERTIFICATE", leafDER, 0o644},
		{"tls.key", "PRIVATE KEY", keyDER, 0o600},
	} {
		// Written aside and renamed: a running injector never reads half a file.
		tmp := filepath.Join(dir, "."+f.name+".tmp")
		if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), f.mode); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			return err
		}
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
