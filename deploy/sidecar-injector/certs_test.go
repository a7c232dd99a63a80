package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// servedSerial is the serial of the certificate the injector serves now,
// read by a client that trusts bundle's CAs; an error when it does not
// verify.
func servedSerial(t *testing.T, in *injector, bundle []byte) (string, error) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("CA unreadable")
	}
	conn, err := tls.Dial("tcp", strings.TrimPrefix(in.url, "https://"), &tls.Config{RootCAs: pool})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A renewal keeps the CA: ca.crt, the caBundle, does not change, and an
// API server that trusts it verifies the injector at every handshake while
// the injector moves from the old certificate to the new one.
func TestCertsRenewalKeepsTheCA(t *testing.T) {
	in := startInjector(t)
	bundle := readFile(t, filepath.Join(in.dir, "ca.crt"))
	before, err := servedSerial(t, in, bundle)
	if err != nil {
		t.Fatal(err)
	}
	oldLeaf := readFile(t, filepath.Join(in.dir, "tls.crt"))
	did, err := writeCerts(in.dir, []string{"localhost"}, certOptions{validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(did, "kept the CA") {
		t.Errorf("certs said %q, want that it kept the CA", did)
	}
	if !bytes.Equal(readFile(t, filepath.Join(in.dir, "ca.crt")), bundle) {
		t.Fatal("a renewal changed ca.crt: the caBundle would change with it")
	}
	if bytes.Equal(readFile(t, filepath.Join(in.dir, "tls.crt")), oldLeaf) {
		t.Fatal("a renewal kept the serving certificate")
	}
	if fi, err := os.Stat(filepath.Join(in.dir, "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("ca.key: %v, mode %v; want it readable by its owner only", err, fi.Mode().Perm())
	}
	waitUntil(t, 30*time.Second, "the renewed certificate to be served", func() bool {
		// Every handshake of the switch verifies with the bundle as it was.
		serial, err := servedSerial(t, in, bundle)
		if err != nil {
			t.Fatalf("during the renewal the unchanged caBundle did not verify the injector: %v", err)
		}
		return serial != before
	}, nil)
}

// A new CA is bundled with the old: a caBundle of the new ca.crt verifies
// the certificate served before the switch and the one after, so the API
// server may take the new bundle before or after the injectors reload.
// -prune leaves the current CA alone, and a renewal after it keeps it.
func TestCertsRotateCABundlesTheOld(t *testing.T) {
	in := startInjector(t)
	oldCA := in.currentCA(t)
	before, err := servedSerial(t, in, oldCA)
	if err != nil {
		t.Fatal(err)
	}
	did, err := writeCerts(in.dir, []string{"localhost"}, certOptions{validity: time.Hour, rotateCA: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(did, "bundled with 1 before it") {
		t.Errorf("certs said %q, want a new CA bundled with the old", did)
	}
	bundle := readFile(t, filepath.Join(in.dir, "ca.crt"))
	cas, err := readCertificates(filepath.Join(in.dir, "ca.crt"))
	if err != nil || len(cas) != 2 {
		t.Fatalf("ca.crt holds %d CAs (%v), want the new and the old", len(cas), err)
	}
	waitUntil(t, 30*time.Second, "the new certificate to be served", func() bool {
		serial, err := servedSerial(t, in, bundle)
		if err != nil {
			t.Fatalf("the bundle does not verify what the injector serves during the switch: %v", err)
		}
		return serial != before
	}, nil)
	if _, err := servedSerial(t, in, oldCA); err == nil {
		t.Error("the old CA alone verifies the new certificate")
	}

	if _, err := writeCerts(in.dir, []string{"localhost"}, certOptions{validity: time.Hour, prune: true}); err != nil {
		t.Fatal(err)
	}
	cas, err = readCertificates(filepath.Join(in.dir, "ca.crt"))
	if err != nil || len(cas) != 1 || !bytes.Equal(cas[0].Raw, mustCerts(t, bundle)[0].Raw) {
		t.Errorf("after -prune ca.crt holds %d CAs (%v), want the current one only", len(cas), err)
	}
}

func mustCerts(t *testing.T, bundle []byte) []*x509.Certificate {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bundle.crt")
	if err := os.WriteFile(path, bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	cs, err := readCertificates(path)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// A directory from before the CA's key was kept (ca.crt alone) gets a new
// CA bundled with the old one: that renewal has no window either. A CA
// key that is not ca.crt's, or a CA that expires before the new
// certificate would, is refused with what to do.
func TestCertsOldLayoutAndBadCA(t *testing.T) {
	dir := t.TempDir()
	if _, err := writeCerts(dir, []string{"localhost"}, certOptions{validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "ca.key")); err != nil {
		t.Fatal(err)
	}
	did, err := writeCerts(dir, []string{"localhost"}, certOptions{validity: time.Hour})
	if err != nil || !strings.Contains(did, "bundled with 1 before it") {
		t.Fatalf("ca.crt without ca.key: %q, %v; want a new CA bundled with the old", did, err)
	}

	other := t.TempDir()
	if _, err := writeCerts(other, []string{"localhost"}, certOptions{validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.key"), readFile(t, filepath.Join(other, "ca.key")), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := writeCerts(dir, []string{"localhost"}, certOptions{validity: time.Hour}); err == nil || !strings.Contains(err.Error(), "ca.key is not the key of ca.crt") {
		t.Errorf("a CA key of another CA: %v, want refused", err)
	}

	short := t.TempDir()
	if _, err := writeCerts(short, []string{"localhost"}, certOptions{validity: time.Hour, caValidity: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := writeCerts(short, []string{"localhost"}, certOptions{validity: 24 * time.Hour}); err == nil || !strings.Contains(err.Error(), "-rotate-ca") {
		t.Errorf("a CA expiring before the certificate: %v, want refused naming -rotate-ca", err)
	}
}
