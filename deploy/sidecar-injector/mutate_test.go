package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	gjsonpatch "gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden patches in testdata")

func testConfig() Config {
	cfg := defaultConfig()
	cfg.Image = "handoff/sidecar:0.1.0"
	return cfg
}

// readPod reads testdata/name.yaml, and returns it as JSON too, as the API
// server would send it.
func readPod(t *testing.T, name string) (*corev1.Pod, []byte) {
	t.Helper()
	y, err := os.ReadFile(filepath.Join("testdata", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := strictJSON(raw, &pod); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &pod, raw
}

func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// applyGolden computes the pod's patch, compares it with the golden file
// (rewritten with -update), applies it to the pod's JSON and decodes the
// result strictly.
func applyGolden(t *testing.T, name string) (*corev1.Pod, *corev1.Pod, []byte) {
	t.Helper()
	pod, raw := readPod(t, name)
	ops, err := patchFor(raw, pod, testConfig())
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) == 0 {
		patch = []byte("[]")
	}
	// The operations' order varies between runs (a diff walks maps), and
	// none depends on another's: the golden file holds them sorted.
	sorted := sortedOps(t, ops)
	golden := filepath.Join("testdata", name+".patch.json")
	if *update {
		if err := os.WriteFile(golden, sorted, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if !bytes.Equal(sorted, want) {
		t.Errorf("%s: patch differs from %s:\n%s", name, golden, sorted)
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("%s: patch does not decode: %v", name, err)
	}
	// Applied to the pod as the API server sent it, not as re-encoded here.
	doc, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("%s: patch does not apply: %v", name, err)
	}
	var out corev1.Pod
	if err := strictJSON(doc, &out); err != nil {
		t.Fatalf("%s: patched pod does not decode strictly: %v", name, err)
	}
	return pod, &out, patch
}

// sortedOps is the operations, indented, in the order of their encodings.
func sortedOps(t *testing.T, ops []gjsonpatch.Operation) []byte {
	t.Helper()
	enc := make([]string, len(ops))
	for i, op := range ops {
		b, err := json.MarshalIndent(op, "  ", "  ")
		if err != nil {
			t.Fatal(err)
		}
		enc[i] = "  " + string(b)
	}
	slices.Sort(enc)
	if len(enc) == 0 {
		return []byte("[]\n")
	}
	return []byte("[\n" + strings.Join(enc, ",\n") + "\n]\n")
}

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

func find(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	i := slices.IndexFunc(cs, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("no container %q in %v", name, names(cs))
	}
	return cs[i]
}

func env(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// checkSidecar checks what every injected sidecar has: its volumes mounted,
// its probes on the metrics port, its environment, and the app's address of
// the admin API.
func checkSidecar(t *testing.T, pod *corev1.Pod, c corev1.Container, adminPort, metricsPort int32, configKey string) {
	t.Helper()
	if got := strings.Join(c.Args, " "); !strings.Contains(got, "run --config /etc/handoff/"+configKey) {
		t.Errorf("args %q do not run the config from the ConfigMap key %s", got, configKey)
	}
	for _, p := range []struct {
		name string
		pr   *corev1.Probe
		path string
	}{{"startup", c.StartupProbe, "/readyz"}, {"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if p.pr == nil || p.pr.HTTPGet == nil || p.pr.HTTPGet.Path != p.path || p.pr.HTTPGet.Port.StrVal != "handoff-metrics" {
			t.Errorf("%s probe = %+v, want GET %s on handoff-metrics", p.name, p.pr, p.path)
		}
	}
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != metricsPort || c.Ports[0].Name != "handoff-metrics" {
		t.Errorf("ports %+v, want handoff-metrics %d", c.Ports, metricsPort)
	}
	if e := env(c, "HANDOFF_INSTANCE_ID"); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("HANDOFF_INSTANCE_ID = %+v, want the pod's name", e)
	}
	if e := env(c, "HANDOFF_JOURNAL_PATH"); e == nil || !strings.HasPrefix(e.Value, "/var/lib/handoff/") {
		t.Errorf("HANDOFF_JOURNAL_PATH = %+v, want on the journal volume", e)
	}
	if e := env(c, "HANDOFF_HTTP_DRAIN"); e == nil || e.Value != "true" {
		t.Errorf("HANDOFF_HTTP_DRAIN = %+v, want true", e)
	}
	if e := env(c, "HANDOFF_ADMIN_LISTEN"); e == nil || !strings.HasPrefix(e.Value, "127.0.0.1:") {
		t.Errorf("HANDOFF_ADMIN_LISTEN = %+v, want the pod's loopback", e)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	if m := mounts["handoff-config"]; !m.ReadOnly || m.MountPath != "/etc/handoff" {
		t.Errorf("config mount %+v, want read-only at /etc/handoff", m)
	}
	if m := mounts["handoff-journal"]; m.ReadOnly || m.MountPath != "/var/lib/handoff" {
		t.Errorf("journal mount %+v, want writable at /var/lib/handoff", m)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	if v := vols["handoff-config"]; v.ConfigMap == nil || v.ConfigMap.Name != pod.Annotations[annConfig] {
		t.Errorf("config volume %+v, want the ConfigMap %q", v, pod.Annotations[annConfig])
	}
	if _, ok := vols["handoff-journal"]; !ok {
		t.Error("no journal volume")
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("security context %+v, want non-root with a read-only root", sc)
	}
	want := "127.0.0.1:" + itoa(adminPort)
	for _, app := range pod.Spec.Containers {
		if app.Name == containerName || isMeshProxy(app) {
			continue
		}
		if e := env(app, envAdminAddr); e == nil || e.Value != want {
			t.Errorf("app container %s: %s = %+v, want %s", app.Name, envAdminAddr, e, want)
		}
		if l := app.Lifecycle; l == nil || l.PreStop == nil || l.PreStop.HTTPGet == nil && l.PreStop.Exec == nil {
			t.Errorf("app container %s has no preStop hook", app.Name)
		} else if g := l.PreStop.HTTPGet; g != nil && (g.Path != "/drain" || g.Port.IntValue() != int(metricsPort)) {
			t.Errorf("app container %s: preStop %+v, want GET /drain on %d", app.Name, g, metricsPort)
		}
	}
	if pod.Annotations[annStatus] != "injected" {
		t.Errorf("status annotation %q, want injected", pod.Annotations[annStatus])
	}
}

func itoa(n int32) string { b, _ := json.Marshal(n); return string(b) }

func TestInjectGolden(t *testing.T) {
	t.Run("plain", func(t *testing.T) {
		_, out, _ := applyGolden(t, "plain")
		if got := names(out.Spec.InitContainers); !slices.Equal(got, []string{"handoff"}) {
			t.Errorf("init containers %v, want [handoff]", got)
		}
		c := find(t, out.Spec.InitContainers, "handoff")
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("restart policy %v, want Always (a native sidecar)", c.RestartPolicy)
		}
		if c.Image != "handoff/sidecar:0.1.0" || c.Resources.Limits.Memory().String() != "256Mi" {
			t.Errorf("image %q, memory limit %s: want the injector's defaults", c.Image, c.Resources.Limits.Memory())
		}
		checkSidecar(t, out, c, 9400, 9464, "handoff.yaml")
		if v := out.Spec.Volumes[slices.IndexFunc(out.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "handoff-journal" })]; v.EmptyDir == nil {
			t.Errorf("journal volume %+v, want an emptyDir", v)
		}
		if env(c, "HANDOFF_ADMIN_TOKEN") != nil {
			t.Error("a token from a Secret nobody named")
		}
	})
	t.Run("init containers", func(t *testing.T) {
		_, out, _ := applyGolden(t, "init-containers")
		// First, so the app's own init containers may use the broker path.
		if got := names(out.Spec.InitContainers); !slices.Equal(got, []string{"handoff", "migrate"}) {
			t.Errorf("init containers %v, want [handoff migrate]", got)
		}
		c := find(t, out.Spec.InitContainers, "handoff")
		checkSidecar(t, out, c, 9400, 9464, "handoff.yaml")
		tok := env(c, "HANDOFF_ADMIN_TOKEN")
		if tok == nil || tok.ValueFrom == nil || tok.ValueFrom.SecretKeyRef == nil || tok.ValueFrom.SecretKeyRef.Name != "orders-admin-token" || tok.ValueFrom.SecretKeyRef.Key != "token" {
			t.Errorf("HANDOFF_ADMIN_TOKEN = %+v, want the Secret's token key", tok)
		}
		if l := find(t, out.Spec.Containers, "worker").Lifecycle; l.PreStop.Exec == nil || l.PreStop.HTTPGet != nil {
			t.Errorf("the worker's own preStop hook was replaced: %+v", l.PreStop)
		}
		if e := env(find(t, out.Spec.Containers, "app"), "LOG_LEVEL"); e == nil || e.Value != "debug" {
			t.Error("the app's own environment was lost")
		}
	})
	t.Run("already injected", func(t *testing.T) {
		in, out, patch := applyGolden(t, "already-injected")
		if string(patch) != "[]" {
			t.Errorf("patch %s, want none", patch)
		}
		if len(out.Spec.InitContainers) != len(in.Spec.InitContainers) || len(out.Spec.Volumes) != 0 {
			t.Error("an injected pod was changed")
		}
	})
	t.Run("custom annotations", func(t *testing.T) {
		_, out, _ := applyGolden(t, "custom")
		c := find(t, out.Spec.InitContainers, "handoff")
		checkSidecar(t, out, c, 9500, 9565, "sidecar.yaml")
		r := c.Resources
		if c.Image != "registry.example/handoff/sidecar:0.2.0" || !r.Requests.Cpu().Equal(resource.MustParse("250m")) ||
			!r.Limits.Cpu().Equal(resource.MustParse("1")) || !r.Requests.Memory().Equal(resource.MustParse("96Mi")) ||
			!r.Limits.Memory().Equal(resource.MustParse("192Mi")) {
			t.Errorf("image %q, resources %+v: not the annotations'", c.Image, r)
		}
		if !slices.Contains(c.Args, "debug") {
			t.Errorf("args %v, want log level debug", c.Args)
		}
		for _, ann := range []string{istioExcludeOutbound, linkerdSkipOutbound} {
			if got := out.Annotations[ann]; got != "9092,9093" {
				t.Errorf("%s = %q, want 9092,9093", ann, got)
			}
		}
	})
	t.Run("non-native", func(t *testing.T) {
		_, out, _ := applyGolden(t, "non-native")
		if len(out.Spec.InitContainers) != 0 {
			t.Errorf("init containers %v, want none", names(out.Spec.InitContainers))
		}
		if got := names(out.Spec.Containers); !slices.Equal(got, []string{"app", "handoff"}) {
			t.Errorf("containers %v, want [app handoff]", got)
		}
		c := find(t, out.Spec.Containers, "handoff")
		if c.RestartPolicy != nil {
			t.Errorf("a plain container with restart policy %v", *c.RestartPolicy)
		}
		checkSidecar(t, out, c, 9400, 9464, "handoff.yaml")
	})
	t.Run("pvc journal", func(t *testing.T) {
		_, out, _ := applyGolden(t, "pvc-journal")
		i := slices.IndexFunc(out.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "handoff-journal" })
		if i < 0 || out.Spec.Volumes[i].PersistentVolumeClaim == nil || out.Spec.Volumes[i].PersistentVolumeClaim.ClaimName != "journal-orders-0" || out.Spec.Volumes[i].EmptyDir != nil {
			t.Errorf("journal volume %+v, want the claim journal-orders-0", out.Spec.Volumes)
		}
		checkSidecar(t, out, find(t, out.Spec.InitContainers, "handoff"), 9400, 9464, "handoff.yaml")
	})
	t.Run("statefulset claim", func(t *testing.T) {
		_, out, _ := applyGolden(t, "statefulset-claim")
		var journals []corev1.Volume
		for _, v := range out.Spec.Volumes {
			if v.Name == "handoff-journal" {
				journals = append(journals, v)
			}
		}
		if len(journals) != 1 || journals[0].PersistentVolumeClaim == nil || journals[0].PersistentVolumeClaim.ClaimName != "handoff-journal-orders-2" {
			t.Errorf("journal volumes %+v, want the pod's own claim, once", journals)
		}
		checkSidecar(t, out, find(t, out.Spec.InitContainers, "handoff"), 9400, 9464, "handoff.yaml")
	})
	t.Run("after istio's native proxy", func(t *testing.T) {
		_, out, _ := applyGolden(t, "istio-native")
		if got := names(out.Spec.InitContainers); !slices.Equal(got, []string{"istio-init", "istio-proxy", "handoff"}) {
			t.Errorf("init containers %v, want the proxy up before handoff", got)
		}
		if got := out.Annotations[istioExcludeOutbound]; got != "15020,5672" {
			t.Errorf("%s = %q, want the mesh's own ports kept and 5672 added", istioExcludeOutbound, got)
		}
		if env(find(t, out.Spec.InitContainers, "istio-proxy"), envAdminAddr) != nil {
			t.Error("the mesh proxy got the app's environment")
		}
		checkSidecar(t, out, find(t, out.Spec.InitContainers, "handoff"), 9400, 9464, "handoff.yaml")
	})
	t.Run("reinvoked after istio", func(t *testing.T) {
		in, out, _ := applyGolden(t, "reinvoked-after-istio")
		if got := names(out.Spec.InitContainers); !slices.Equal(got, []string{"istio-init", "istio-proxy", "handoff"}) {
			t.Errorf("init containers %v, want handoff moved behind the proxy", got)
		}
		if len(out.Spec.Volumes) != len(in.Spec.Volumes) || len(out.Spec.Containers[0].Env) != 1 {
			t.Error("a reinvocation changed more than the order")
		}
	})
	t.Run("beside linkerd's plain proxy", func(t *testing.T) {
		_, out, _ := applyGolden(t, "linkerd-plain")
		if got := names(out.Spec.InitContainers); !slices.Equal(got, []string{"handoff", "linkerd-init"}) {
			t.Errorf("init containers %v", got)
		}
		if env(find(t, out.Spec.Containers, "linkerd-proxy"), envAdminAddr) != nil {
			t.Error("the mesh proxy got the app's environment")
		}
		checkSidecar(t, out, find(t, out.Spec.InitContainers, "handoff"), 9400, 9464, "handoff.yaml")
	})
	t.Run("not asking", func(t *testing.T) {
		_, _, patch := applyGolden(t, "not-asking")
		if string(patch) != "[]" {
			t.Errorf("patch %s for a pod that did not ask", patch)
		}
	})
}

// A bad annotation denies the pod with a message that names it and the fix;
// so does each other kind of bad value.
func TestInjectDeniesBadAnnotations(t *testing.T) {
	pod, raw := readPod(t, "bad-annotation")
	_, err := patchFor(raw, pod, testConfig())
	var d *Denial
	if !errors.As(err, &d) || d.Annotation != annMemLimit {
		t.Fatalf("err = %v, want a denial naming %s", err, annMemLimit)
	}
	// The message the user reads, golden like the patches.
	golden := filepath.Join("testdata", "bad-annotation.denial.txt")
	if *update {
		if err := os.WriteFile(golden, []byte(err.Error()+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if want, rerr := os.ReadFile(golden); rerr != nil || string(want) != err.Error()+"\n" {
		t.Errorf("denial %q, want %s (%v)", err, golden, rerr)
	}
	base, _ := readPod(t, "plain")
	for ann, val := range map[string]string{
		annInject:       "yes please",
		annNative:       "maybe",
		annLogLevel:     "loud",
		annAdminPort:    "70000",
		annMetricsPort:  "9400",
		annCPURequest:   "-1",
		annBrokerPorts:  "5672,amqp",
		annJournalClaim: "Not_A_Name",
		annConfigKey:    "a/b",
	} {
		pod := base.DeepCopy()
		pod.Annotations[ann] = val
		_, err := inject(pod, testConfig())
		if !errors.As(err, &d) || d.Annotation != ann || d.Fix == "" {
			t.Errorf("%s: %q: err = %v, want a denial naming it with a fix", ann, val, err)
		}
	}
	pod, _ = readPod(t, "statefulset-claim")
	pod.Annotations[annJournalClaim] = "another-claim"
	if _, err := inject(pod, testConfig()); !errors.As(err, &d) || d.Annotation != annJournalClaim {
		t.Errorf("a claim named beside the pod's own journal volume: err = %v, want a denial naming %s", err, annJournalClaim)
	}
	pod = base.DeepCopy()
	delete(pod.Annotations, annConfig)
	if _, err := inject(pod, testConfig()); !errors.As(err, &d) || d.Annotation != annConfig {
		t.Errorf("no config: err = %v, want a denial naming %s", err, annConfig)
	}
	pod = base.DeepCopy()
	pod.Annotations[annCPURequest], pod.Annotations[annCPULimit] = "2", "500m"
	if _, err := inject(pod, testConfig()); !errors.As(err, &d) || !strings.Contains(d.Problem, "above limit") {
		t.Errorf("request above limit: err = %v", err)
	}
}

// Injecting twice is injecting once: the second call, as a reinvocation
// would make it, returns no patch.
func TestInjectIsIdempotent(t *testing.T) {
	pod, _ := readPod(t, "istio-native")
	once, err := inject(pod, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(once)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := patchFor(raw, once, testConfig())
	if err != nil || len(ops) != 0 {
		t.Errorf("second injection: %d operations, %v; want none", len(ops), err)
	}
}
