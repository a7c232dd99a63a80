package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// injector is a webhook server on loopback over real TLS, with the
// certificate files it serves from.
type injector struct {
	url, dir string
	stop     func()
}

func startInjector(t *testing.T) *injector {
	t.Helper()
	return startInjectorWith(t, testConfig)
}

// startInjectorWith is startInjector with the config cfg returns at each
// review.
func startInjectorWith(t *testing.T, cfg func() Config) *injector {
	t.Helper()
	dir := t.TempDir()
	if _, err := writeCerts(dir, []string{"localhost", "handoff-injector.handoff-system.svc"}, certOptions{validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	certs, err := newCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), log)
	if err != nil {
		t.Fatal(err)
	}
	certs.every = 0 // every handshake looks at the files
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, cfg, certs, log) }()
	in := &injector{url: "https://localhost:" + strings.TrimPrefix(ln.Addr().String(), "127.0.0.1:"), dir: dir}
	in.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
	t.Cleanup(in.stop)
	return in
}

// client trusts the CAs in the injector's ca.crt as it is now, as an API
// server with it as the caBundle would.
func (in *injector) client(t *testing.T) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(in.dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	return trusting(t, pem)
}

// currentCA is the CA that signs what `certs` issues now, alone.
func (in *injector) currentCA(t *testing.T) []byte {
	t.Helper()
	certs, err := readCertificates(filepath.Join(in.dir, "ca.crt"))
	if err != nil || len(certs) == 0 {
		t.Fatalf("ca.crt: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certs[0].Raw})
}

// trusting is a client that trusts the CAs of a PEM bundle.
func trusting(t *testing.T, bundle []byte) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("CA unreadable")
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		DisableKeepAlives: true, // each request a handshake: it sees the certificate of the moment
	}}
}

func (in *injector) review(t *testing.T, c *http.Client, pod []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	rv := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("3f1c-uid"),
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: "shop",
			Operation: admissionv1.Create,
			Object:    runtime.RawExtension{Raw: pod},
		},
	}
	body, err := json.Marshal(rv)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Post(in.url+"/mutate", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var out admissionv1.AdmissionReview
	if err := strictJSON(mustRead(t, resp.Body), &out); err != nil {
		t.Fatalf("answer is not an AdmissionReview: %v", err)
	}
	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" || out.Response == nil || out.Response.UID != "3f1c-uid" {
		t.Fatalf("answer %+v: want a v1 review answering uid 3f1c-uid", out)
	}
	return out.Response
}

func mustRead(t *testing.T, r io.Reader) []byte {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The webhook over HTTPS: a pod that asks is patched (and the patch makes
// the pod the golden test expects), a bad annotation is denied with its
// name, a pod that does not ask passes unchanged, and what is not a review
// is refused.
func TestWebhookOverHTTPS(t *testing.T) {
	in := startInjector(t)
	c := in.client(t)

	_, raw := readPod(t, "plain")
	resp := in.review(t, c, raw)
	if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("plain pod: %+v, want allowed with a JSON patch", resp)
	}
	p, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("the answer's patch does not apply: %v", err)
	}
	var pod corev1.Pod
	if err := strictJSON(doc, &pod); err != nil {
		t.Fatal(err)
	}
	checkSidecar(t, &pod, find(t, pod.Spec.InitContainers, "handoff"), 9400, 9464, "handoff.yaml")

	_, raw = readPod(t, "bad-annotation")
	resp = in.review(t, c, raw)
	if resp.Allowed || resp.Result == nil || !strings.Contains(resp.Result.Message, annMemLimit) || resp.Result.Code != http.StatusUnprocessableEntity {
		t.Errorf("bad annotation: %+v, want denied naming %s", resp.Result, annMemLimit)
	}

	_, raw = readPod(t, "not-asking")
	if resp = in.review(t, c, raw); !resp.Allowed || resp.Patch != nil {
		t.Errorf("pod not asking: %+v, want allowed unchanged", resp)
	}

	r, err := c.Post(in.url+"/mutate", "text/plain", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: status %d, want 415", r.StatusCode)
	}
	r, err = c.Post(in.url+"/mutate", "application/json", strings.NewReader(`{"kind":"AdmissionReview"}`))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusBadRequest {
		t.Errorf("a review without a request: status %d, want 400", r.StatusCode)
	}
	r, err = c.Get(in.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Errorf("/healthz: status %d", r.StatusCode)
	}
}

// A renewed certificate is served once its files change, without a
// restart. A new CA (certs -rotate-ca): a client that trusts only the new
// CA gets through once the new certificate is served, one that trusts only
// the old one no longer does.
func TestWebhookReloadsRotatedCertificate(t *testing.T) {
	in := startInjector(t)
	old := trusting(t, in.currentCA(t))
	if _, err := old.Get(in.url + "/healthz"); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	if _, err := writeCerts(in.dir, []string{"localhost"}, certOptions{validity: time.Hour, rotateCA: true}); err != nil {
		t.Fatal(err)
	}
	fresh := trusting(t, in.currentCA(t))
	waitUntil(t, 30*time.Second, "the new certificate to be served", func() bool {
		resp, err := fresh.Get(in.url + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}, nil)
	if _, err := old.Get(in.url + "/healthz"); err == nil {
		t.Error("the old CA alone still verifies: the old certificate is still served")
	}
	// Half a rotation (a key that does not match the certificate) keeps
	// the certificate that works.
	if err := os.WriteFile(filepath.Join(in.dir, "tls.key"), []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Get(in.url + "/healthz"); err != nil {
		t.Errorf("a broken key file broke the served certificate: %v", err)
	}
}

// A pod a controller makes has generateName and no name, and the API server
// names it after admission only while the name is empty: the patch never
// touches the name, so every replica still gets a name of its own.
func TestWebhookKeepsGeneratedName(t *testing.T) {
	in := startInjector(t)
	c := in.client(t)
	for _, name := range []string{"deployment", "job", "daemonset"} {
		t.Run(name, func(t *testing.T) {
			_, raw := readPod(t, name)
			resp := in.review(t, c, raw)
			if !resp.Allowed || len(resp.Patch) == 0 {
				t.Fatalf("%+v, want allowed with a patch", resp.Result)
			}
			var ops []struct{ Op, Path string }
			if err := json.Unmarshal(resp.Patch, &ops); err != nil {
				t.Fatal(err)
			}
			for _, op := range ops {
				if strings.HasPrefix(op.Path, "/metadata/name") || strings.HasPrefix(op.Path, "/metadata/generateName") {
					t.Errorf("the patch touches the name: %s %s", op.Op, op.Path)
				}
			}
			p, err := jsonpatch.DecodePatch(resp.Patch)
			if err != nil {
				t.Fatal(err)
			}
			doc, err := p.Apply(raw)
			if err != nil {
				t.Fatalf("the patch does not apply: %v", err)
			}
			var pod corev1.Pod
			if err := strictJSON(doc, &pod); err != nil {
				t.Fatal(err)
			}
			var want corev1.Pod
			_ = json.Unmarshal(raw, &want)
			if pod.Name != "" || pod.GenerateName != want.GenerateName {
				t.Errorf("name %q, generateName %q: want no name and generateName %q", pod.Name, pod.GenerateName, want.GenerateName)
			}
		})
	}
}

// Each pod gets a drain token of its own, random: its sidecar requires it,
// its preStop hook sends it, and another pod's does not open this one.
func TestWebhookDrainTokenPerPod(t *testing.T) {
	in := startInjector(t)
	c := in.client(t)
	_, raw := readPod(t, "deployment")
	tokens := map[string]bool{}
	for range 3 {
		resp := in.review(t, c, raw)
		var pod corev1.Pod
		if err := strictJSON(applyPatch(t, raw, resp.Patch), &pod); err != nil {
			t.Fatal(err)
		}
		side := find(t, pod.Spec.InitContainers, containerName)
		checkSidecar(t, &pod, side, 9400, 9464, "handoff.yaml")
		tok := env(side, envDrainToken).Value
		if len(tok) < 26 {
			t.Errorf("drain token %q: want 128 random bits", tok)
		}
		tokens[tok] = true
	}
	if len(tokens) != 3 {
		t.Errorf("three pods, %d distinct drain tokens", len(tokens))
	}
}

// The injector's config is read again when its file changes, as the
// kubelet updates a ConfigMap's volume: the next pod gets the new image
// without a restart. A config that does not load keeps the one before.
func TestWebhookReloadsConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	write := func(content string) {
		t.Helper()
		// As the kubelet does: a new file renamed over the old.
		tmp := filepath.Join(dir, ".config.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("image: registry.example/handoff/sidecar:1.0.0\n")
	var logs syncBuffer
	cfgs, err := newConfigReloader(path, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cfgs.every = 0
	in := startInjectorWith(t, cfgs.get)
	c := in.client(t)
	_, raw := readPod(t, "plain")
	image := func() string {
		t.Helper()
		resp := in.review(t, c, raw)
		var pod corev1.Pod
		if err := strictJSON(applyPatch(t, raw, resp.Patch), &pod); err != nil {
			t.Fatal(err)
		}
		return find(t, pod.Spec.InitContainers, containerName).Image
	}
	if got := image(); got != "registry.example/handoff/sidecar:1.0.0" {
		t.Fatalf("image %q, want the config's", got)
	}
	write("image: registry.example/handoff/sidecar:1.1.0\nlogLevel: debug\n")
	waitUntil(t, 30*time.Second, "the changed config to be used", func() bool {
		if image() == "registry.example/handoff/sidecar:1.1.0" {
			return true
		}
		// The file's time may equal the old one within the clock's step:
		// the next write moves it on.
		write(fmt.Sprintf("image: registry.example/handoff/sidecar:1.1.0\nlogLevel: debug\n# %d\n", time.Now().UnixNano()))
		return false
	}, &logs)
	write("image: registry.example/handoff/sidecar:2.0.0\nno-such-key: 1\n")
	waitUntil(t, 30*time.Second, "the bad config's warning", func() bool {
		_ = image()
		return strings.Contains(logs.String(), "config does not load")
	}, &logs)
	if got := image(); got != "registry.example/handoff/sidecar:1.1.0" {
		t.Errorf("image %q after a bad config, want the one before kept", got)
	}
}
