package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"handoff.dev/handoff/internal/broker/brokertest"
)

// buildSidecar builds the sidecar's binary, as make build does, into the
// test's directory.
func buildSidecar(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sidecar")
	out, err := exec.Command("go", "build", "-o", bin, "handoff.dev/handoff/cmd/sidecar").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// syncBuffer is a log written by a process and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// kubelet runs an injected sidecar container as the kubelet would: its
// args and environment, its volumes as directories of the test's, and
// its probes and the app's preStop hook against the process.
type kubelet struct {
	t       *testing.T
	sidecar corev1.Container
	app     corev1.Container
	mounts  map[string]string // mountPath → the test's directory
	cmd     *exec.Cmd
	log     *syncBuffer
	metrics string // where the container's metrics port is bound
}

var healthListening = regexp.MustCompile(`"msg":"health endpoints listening","addr":"([^"]+)"`)

// start runs the sidecar with the pod's name and its config volume
// holding files; listeners on the pod's ports bind free ports instead.
func (k *kubelet) start(bin, podName string, files map[string]string) {
	t := k.t
	t.Helper()
	k.mounts = map[string]string{}
	for _, m := range k.sidecar.VolumeMounts {
		dir := filepath.Join(t.TempDir(), m.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		k.mounts[m.MountPath] = dir
	}
	for path, content := range files {
		if err := os.WriteFile(k.local(path), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var args []string
	for _, a := range k.sidecar.Args {
		args = append(args, k.local(a))
	}
	env := []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range k.sidecar.Env {
		v := k.local(e.Value)
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			v = podName
		case e.ValueFrom != nil:
			t.Fatalf("env %s from %+v: the test knows only the pod's name", e.Name, e.ValueFrom)
		case e.Name == "HANDOFF_METRICS_LISTEN" || e.Name == "HANDOFF_ADMIN_LISTEN":
			host, _, err := net.SplitHostPort(v)
			if err != nil {
				t.Fatalf("%s=%q: %v", e.Name, v, err)
			}
			v = net.JoinHostPort(host, "0")
		}
		env = append(env, e.Name+"="+v)
	}
	k.log = &syncBuffer{}
	k.cmd = exec.Command(bin, args...)
	k.cmd.Env = env
	k.cmd.Stderr = k.log
	if err := k.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if k.cmd.ProcessState == nil {
			_ = k.cmd.Process.Kill()
			_ = k.cmd.Wait()
		}
	})
	waitUntil(t, 20*time.Second, "the sidecar's health server", func() bool {
		m := healthListening.FindStringSubmatch(k.log.String())
		if m == nil {
			return false
		}
		_, port, err := net.SplitHostPort(m[1])
		if err != nil {
			t.Fatal(err)
		}
		k.metrics = net.JoinHostPort("127.0.0.1", port)
		return true
	}, k.log)
}

// local is path with a mount path replaced by the test's directory.
func (k *kubelet) local(path string) string {
	for mp, dir := range k.mounts {
		if path == mp || strings.HasPrefix(path, mp+"/") {
			return dir + strings.TrimPrefix(path, mp)
		}
	}
	return path
}

// addr is where port (a number, or a name of the sidecar's ports) is
// bound; only the metrics port is bound here.
func (k *kubelet) addr(port intstr.IntOrString) string {
	k.t.Helper()
	for _, p := range k.sidecar.Ports {
		if port.Type == intstr.String && p.Name == port.StrVal || port.Type == intstr.Int && p.ContainerPort == port.IntVal {
			return k.metrics
		}
	}
	k.t.Fatalf("port %s is none of the sidecar's %+v", port.String(), k.sidecar.Ports)
	return ""
}

// get sends the HTTP GET a probe or hook describes, as the kubelet does.
func (k *kubelet) get(g *corev1.HTTPGetAction, timeout time.Duration) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+k.addr(g.Port)+g.Path, nil)
	if err != nil {
		return 0, "", err
	}
	for _, h := range g.HTTPHeaders {
		req.Header.Set(h.Name, h.Value)
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

// probe runs a probe as the kubelet does until it succeeds once, and
// returns how long that took; the test fails once the probe would have
// failed for good (failureThreshold periods).
func (k *kubelet) probe(name string, p *corev1.Probe) time.Duration {
	t := k.t
	t.Helper()
	start := time.Now()
	period := time.Duration(p.PeriodSeconds) * time.Second
	var last string
	for i := int32(0); i < p.FailureThreshold; i++ {
		code, body, err := k.get(p.HTTPGet, time.Duration(p.TimeoutSeconds)*time.Second)
		if err == nil && code >= 200 && code < 400 {
			return time.Since(start)
		}
		last = fmt.Sprintf("%d %q %v", code, body, err)
		time.Sleep(period)
	}
	t.Fatalf("%s probe failed %d times (last %s): the kubelet would restart the sidecar; log:\n%s", name, p.FailureThreshold, last, k.log)
	return 0
}

// waitUntil polls cond until it holds, failing the test after timeout with
// log, when there is one.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool, log fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			if log == nil {
				t.Fatalf("timed out after %v waiting for %s", timeout, what)
			}
			t.Fatalf("timed out after %v waiting for %s; log:\n%s", timeout, what, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The injected sidecar, run as the kubelet runs a native sidecar, with 50
// messages waiting and no app yet: its startup probe passes within
// seconds while the old gate (/readyz) says the app is unreachable; then
// the app starts, as the kubelet starts it after the startup probe, the
// backlog drains, and the app's preStop hook drains the sidecar with the
// pod's token.
func TestInjectedSidecarStartsBeforeItsApp(t *testing.T) {
	brokertest.SkipShort(t, "the sidecar binary and Apache Kafka")
	brokers, topic := brokertest.KafkaTopic(t, "injected-startup", 2)
	const backlog = 50
	var recs []*kgo.Record
	for i := range backlog {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint(i)), Value: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	brokertest.Produce(t, brokers, recs...)
	bin := buildSidecar(t)

	// The app's address, bound only once the kubelet starts it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	appAddr := ln.Addr().String()
	ln.Close()

	_, raw := readPod(t, "deployment")
	var pod corev1.Pod
	if err := json.Unmarshal(raw, &pod); err != nil {
		t.Fatal(err)
	}
	ops, err := patchFor(raw, &pod, testConfig(), rand.Text)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	var injected corev1.Pod
	if err := strictJSON(applyPatch(t, raw, patch), &injected); err != nil {
		t.Fatal(err)
	}
	k := &kubelet{t: t, sidecar: find(t, injected.Spec.InitContainers, containerName), app: find(t, injected.Spec.Containers, "app")}
	begin := time.Now()
	k.start(bin, "orders-7c9d8b6f4-x2vq9", map[string]string{
		configDir + "/" + defaultConfigKey: fmt.Sprintf(`handler: {url: "http://%s/events", timeout: 2s}
sources:
  - name: orders
    kafka: {brokers: [%q], topic: %q, group: %q, session_timeout: 6s}
retry: {tiers: [1s]}
`, appAddr, brokers[0], topic, brokertest.KafkaGroup(topic)),
	})

	k.probe("startup", k.sidecar.StartupProbe)
	if took := time.Since(begin); took > 10*time.Second {
		t.Errorf("the startup probe passed %v after the sidecar started, want within seconds", took)
	} else {
		t.Logf("startup probe passed %v after the sidecar started", took.Round(time.Millisecond))
	}
	// The backlog is being tried against no app: what held the old
	// startup probe (/readyz) at 503 for good.
	var ready string
	waitUntil(t, 60*time.Second, "a delivery to find the app unreachable", func() bool {
		code, body, err := k.get(&corev1.HTTPGetAction{Path: "/readyz", Port: k.sidecar.StartupProbe.HTTPGet.Port}, 2*time.Second)
		ready = body
		return err == nil && code == http.StatusServiceUnavailable && strings.Contains(body, "app unreachable")
	}, k.log)
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
	}{{"startup", k.sidecar.StartupProbe}, {"readiness", k.sidecar.ReadinessProbe}, {"liveness", k.sidecar.LivenessProbe}} {
		if code, body, err := k.get(p.probe.HTTPGet, time.Second); err != nil || code != http.StatusOK {
			t.Errorf("%s probe %s with the app away (/readyz: %q) = %d %q %v, want 200", p.name, p.probe.HTTPGet.Path, ready, code, body, err)
		}
	}

	// The kubelet starts the app.
	var mu sync.Mutex
	seen := map[string]bool{}
	appStarted := time.Now()
	ln, err = net.Listen("tcp", appAddr)
	if err != nil {
		t.Fatalf("the app's address was taken meanwhile: %v", err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen[string(body)] = true
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = app.Serve(ln) }()
	defer app.Close()
	waitUntil(t, 60*time.Second, "the backlog at the app", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == backlog
	}, k.log)
	t.Logf("the app had all %d messages %v after it started", backlog, time.Since(appStarted).Round(time.Millisecond))
	waitUntil(t, 30*time.Second, "/readyz with the app back", func() bool {
		code, _, err := k.get(&corev1.HTTPGetAction{Path: "/readyz", Port: k.sidecar.StartupProbe.HTTPGet.Port}, 2*time.Second)
		return err == nil && code == http.StatusOK
	}, k.log)
	k.probe("readiness", k.sidecar.ReadinessProbe)

	// The pod stops: the kubelet runs the app's preStop hook, which
	// drains the sidecar with the pod's token; the sidecar exits 0.
	hook := k.app.Lifecycle.PreStop.HTTPGet
	if code, body, err := k.get(&corev1.HTTPGetAction{Path: hook.Path, Port: hook.Port}, 5*time.Second); err != nil || code != http.StatusUnauthorized {
		t.Errorf("the hook without its token = %d %q %v, want 401", code, body, err)
	}
	if code, body, err := k.get(hook, 30*time.Second); err != nil || code != http.StatusOK || body != "drained\n" {
		t.Fatalf("preStop hook = %d %q %v, want 200 drained; log:\n%s", code, body, err, k.log)
	}
	done := make(chan error, 1)
	go func() { done <- k.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the sidecar exited with %v after the drain; log:\n%s", err, k.log)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the sidecar still runs 30s after the drain; log:\n%s", k.log)
	}
}
