package main

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"handoff.dev/handoff/internal/testkit"
)

// testToken is the drain token of every pod the tests inject: golden
// patches need one that does not change.
func testToken() string { return "TESTDRAINTOKEN23456789ABCD" }

func testConfig() Config {
	cfg := defaultConfig()
	cfg.Image = "handoff/sidecar:0.1.0"
	return cfg
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
	}{{"startup", c.StartupProbe, "/startupz"}, {"readiness", c.ReadinessProbe, "/runningz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
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
	var drainToken string
	if e := env(c, envDrainToken); e == nil || len(e.Value) < 16 {
		t.Errorf("%s = %+v, want a token of 16 bytes or more", envDrainToken, e)
	} else {
		drainToken = e.Value
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
	// What Pod Security "restricted" requires of a container.
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("security context %+v, want what Pod Security restricted requires: no escalation, ALL dropped, seccomp RuntimeDefault", sc)
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
		} else if g != nil && (len(g.HTTPHeaders) != 1 || g.HTTPHeaders[0].Name != "Authorization" || g.HTTPHeaders[0].Value != "Bearer "+drainToken) {
			t.Errorf("app container %s: preStop headers %+v, want the sidecar's drain token as a bearer token", app.Name, g.HTTPHeaders)
		} else if g == nil {
			// A hook of the app's own sends the token itself.
			if e := env(app, envDrainToken); e == nil || e.Value != drainToken {
				t.Errorf("app container %s with a hook of its own: %s = %+v, want the drain token", app.Name, envDrainToken, e)
			}
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
		if c.Image != "handoff/sidecar:0.1.0" || c.Resources.Limits.Memory().String() != "512Mi" {
			t.Errorf("image %q, memory limit %s: want the injector's defaults", c.Image, c.Resources.Limits.Memory())
		}
		if e := env(c, "GOMEMLIMIT"); e == nil || e.Value != "460MiB" {
			t.Errorf("GOMEMLIMIT = %+v, want 460MiB: nine tenths of the limit", e)
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
		if e := env(c, "GOMEMLIMIT"); e == nil || e.Value != "172MiB" {
			t.Errorf("GOMEMLIMIT = %+v, want 172MiB: nine tenths of the annotation's 192Mi", e)
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
	// Pods as controllers make them: no name yet, the API server's
	// defaults, the token volume. The patch adds to what is there (the
	// volumes, the container's mounts) and names nothing.
	for _, tc := range []struct{ name, generateName, app string }{
		{"deployment", "orders-7c9d8b6f4-", "app"},
		{"job", "reindex-orders-", "reindex"},
		{"daemonset", "node-events-", "agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, out, _ := applyGolden(t, tc.name)
			if out.Name != "" || out.GenerateName != tc.generateName {
				t.Errorf("name %q, generateName %q: want no name, generateName %q", out.Name, out.GenerateName, tc.generateName)
			}
			checkSidecar(t, out, find(t, out.Spec.InitContainers, "handoff"), 9400, 9464, "handoff.yaml")
			if got := len(out.Spec.Volumes); got != len(in.Spec.Volumes)+2 || out.Spec.Volumes[0].Name != in.Spec.Volumes[0].Name {
				t.Errorf("volumes %+v: want the token volume first, then the sidecar's two", out.Spec.Volumes)
			}
			app := find(t, out.Spec.Containers, tc.app)
			if len(app.VolumeMounts) != 1 || app.TerminationMessagePath != "/dev/termination-log" {
				t.Errorf("the app's mounts or defaults changed: %+v", app)
			}
			if len(out.OwnerReferences) != 1 || len(out.Spec.Tolerations) != len(in.Spec.Tolerations) || out.Spec.SchedulerName != "default-scheduler" {
				t.Errorf("owner %+v, tolerations %d, scheduler %q: the pod's own changed", out.OwnerReferences, len(out.Spec.Tolerations), out.Spec.SchedulerName)
			}
		})
	}
	t.Run("fields the injector does not know", func(t *testing.T) {
		_, _, patch := applyGolden(t, "future-fields")
		_, raw := readPod(t, "future-fields")
		var doc struct {
			Metadata map[string]any `json:"metadata"`
			Spec     struct {
				FutureField map[string]any   `json:"futureField"`
				Containers  []map[string]any `json:"containers"`
			} `json:"spec"`
		}
		if err := json.Unmarshal(applyPatch(t, raw, patch), &doc); err != nil {
			t.Fatal(err)
		}
		if doc.Spec.FutureField["mode"] != "Strict" || len(doc.Spec.Containers) != 1 || doc.Spec.Containers[0]["unknownContainerField"] == nil {
			t.Errorf("spec %+v: the unknown fields are gone", doc.Spec)
		}
		if env, _ := doc.Spec.Containers[0]["env"].([]any); len(env) != 2 || env[0].(map[string]any)["futureEnvField"] != "x" {
			t.Errorf("env %v: want LOG_LEVEL with its unknown field, then %s", env, envAdminAddr)
		}
		if _, ok := doc.Metadata["name"]; ok {
			t.Errorf("metadata %v: a name was written", doc.Metadata)
		}
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
	_, err := patchFor(raw, pod, testConfig(), testToken)
	var d *Denial
	if !errors.As(err, &d) || d.Annotation != annMemLimit {
		t.Fatalf("err = %v, want a denial naming %s", err, annMemLimit)
	}
	// The message the user reads, golden like the patches.
	testkit.Golden(t, "bad-annotation.denial.txt", err.Error()+"\n")
	base, _ := readPod(t, "plain")
	for _, tc := range []struct{ ann, val string }{
		{annInject, "yes please"},
		{annInject, "1"},
		{annInject, "True"},
		{annInject, "TRUE"},
		{annInject, "t"},
		{annNative, "maybe"},
		{annNative, "0"},
		{annLogLevel, "loud"},
		{annAdminPort, "70000"},
		{annMetricsPort, "9400"},
		{annCPURequest, "-1"},
		{annBrokerPorts, "5672,amqp"},
		{annJournalClaim, "Not_A_Name"},
		{annConfigKey, "a/b"},
	} {
		pod := base.DeepCopy()
		pod.Annotations[tc.ann] = tc.val
		_, err := injectPod(t, pod, testConfig())
		if !errors.As(err, &d) || d.Annotation != tc.ann || d.Fix == "" || !strings.Contains(err.Error(), tc.ann) {
			t.Errorf("%s: %q: err = %v, want a denial naming it with a fix", tc.ann, tc.val, err)
		}
	}
	// A pod that does not ask is denied for an inject annotation that is
	// neither, and passes with "false".
	pod = base.DeepCopy()
	pod.Annotations[annInject] = "False"
	if _, err := injectPod(t, pod, testConfig()); !errors.As(err, &d) || d.Annotation != annInject {
		t.Errorf(`inject "False": err = %v, want a denial naming %s`, err, annInject)
	}
	pod.Annotations[annInject] = "false"
	if out, err := injectPod(t, pod, testConfig()); err != nil || len(out.Spec.InitContainers) != 0 {
		t.Errorf(`inject "false": %v, init containers %v; want the pod unchanged`, err, out)
	}
	pod, _ = readPod(t, "statefulset-claim")
	pod.Annotations[annJournalClaim] = "another-claim"
	if _, err := injectPod(t, pod, testConfig()); !errors.As(err, &d) || d.Annotation != annJournalClaim {
		t.Errorf("a claim named beside the pod's own journal volume: err = %v, want a denial naming %s", err, annJournalClaim)
	}
	pod = base.DeepCopy()
	delete(pod.Annotations, annConfig)
	if _, err := injectPod(t, pod, testConfig()); !errors.As(err, &d) || d.Annotation != annConfig {
		t.Errorf("no config: err = %v, want a denial naming %s", err, annConfig)
	}
	pod = base.DeepCopy()
	pod.Annotations[annCPURequest], pod.Annotations[annCPULimit] = "2", "500m"
	if _, err := injectPod(t, pod, testConfig()); !errors.As(err, &d) || !strings.Contains(d.Problem, "above limit") {
		t.Errorf("request above limit: err = %v", err)
	}
}

// The grace period must leave the app time to stop after the drain: a pod
// whose terminationGracePeriodSeconds is not above the drain by the
// config's appStopTime is denied with both figures; the sidecar is told
// the drain it was checked against.
func TestInjectChecksGracePeriod(t *testing.T) {
	base, _ := readPod(t, "deployment")
	grace := func(s int64) *int64 { return &s }
	tests := []struct {
		name  string
		grace *int64
		drain string // the annotation, "" for the config's
		want  string // the sidecar's HANDOFF_DRAIN_TIMEOUT, or "" when denied
		msg   []string
	}{
		{"defaults fit the default grace", grace(30), "", "20s", nil},
		{"no grace period named", nil, "", "20s", nil},
		{"a drain as long as the grace", grace(30), "30s", "", []string{"terminationGracePeriodSeconds 30 leaves the app 0s to stop after the sidecar's drain (shutdown.drain_timeout 30s)", "at least 40"}},
		{"a short grace", grace(15), "", "", []string{"terminationGracePeriodSeconds 15", "shutdown.drain_timeout 20s", "at least 30"}},
		{"a long drain, a long grace", grace(90), "1m", "1m0s", nil},
		{"a long drain, the default grace", grace(30), "1m", "", []string{"leaves the app 0s", "at least 70"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := base.DeepCopy()
			pod.Spec.TerminationGracePeriodSeconds = tc.grace
			if tc.drain != "" {
				pod.Annotations[annDrain] = tc.drain
			}
			out, err := injectPod(t, pod, testConfig())
			if tc.want == "" {
				var d *Denial
				if !errors.As(err, &d) || d.Annotation != annDrain {
					t.Fatalf("err = %v, want a denial naming %s", err, annDrain)
				}
				for _, m := range tc.msg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("denial %q does not say %q", err, m)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e := env(find(t, out.Spec.InitContainers, containerName), "HANDOFF_DRAIN_TIMEOUT"); e == nil || e.Value != tc.want {
				t.Errorf("HANDOFF_DRAIN_TIMEOUT = %+v, want %s", e, tc.want)
			}
			if !reflect.DeepEqual(out.Spec.TerminationGracePeriodSeconds, tc.grace) {
				t.Errorf("grace period %v, want it left as it was", out.Spec.TerminationGracePeriodSeconds)
			}
		})
	}
	for _, v := range []string{"soon", "0s", "500ms", "2h", "-1m"} {
		pod := base.DeepCopy()
		pod.Annotations[annDrain] = v
		var d *Denial
		if _, err := injectPod(t, pod, testConfig()); !errors.As(err, &d) || d.Annotation != annDrain || !strings.Contains(d.Problem, "not a duration") {
			t.Errorf("%s %q: err = %v, want a denial naming it", annDrain, v, err)
		}
	}
}

// Injecting twice is injecting once: the second call, as a reinvocation
// would make it, returns no patch.
func TestInjectIsIdempotent(t *testing.T) {
	pod, _ := readPod(t, "istio-native")
	once, err := injectPod(t, pod, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(once)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := patchFor(raw, once, testConfig(), testToken)
	if err != nil || len(ops) != 0 {
		t.Errorf("second injection: %d operations, %v; want none", len(ops), err)
	}
}
