package main

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestPointerEscapes(t *testing.T) {
	tests := []struct {
		name   string
		tokens []string
		want   string
	}{
		{"plain", []string{"spec", "volumes", "-"}, "/spec/volumes/-"},
		{"slash", []string{"metadata", "annotations", "handoff.dev/status"}, "/metadata/annotations/handoff.dev~1status"},
		{"tilde before slash", []string{"a~/b"}, "/a~0~1b"},
		{"tilde one", []string{"x~1"}, "/x~01"},
		{"empty token", []string{""}, "/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := pointer(tc.tokens...); got != tc.want {
				t.Errorf("pointer(%q) = %q, want %q", tc.tokens, got, tc.want)
			}
		})
	}
}

// Where the request has an object without the member the injector adds
// (a lifecycle with only postStart), the member is added and the rest
// kept; where it has null (env: null, volumes: null), the whole value is
// added in its place; an annotation key with a ~ and a / reaches the right
// key. Applied with a real JSON patch implementation.
func TestPatchAddsBesideAndInPlaceOfNull(t *testing.T) {
	raw := []byte(`{
  "apiVersion": "v1", "kind": "Pod",
  "metadata": {"generateName": "orders-", "annotations": {
    "handoff.dev/inject": "true", "handoff.dev/config": "orders-handoff",
    "handoff.dev/exclude-outbound-ports": "5672",
    "traffic.sidecar.istio.io/excludeOutboundPorts": "15020"}},
  "spec": {
    "volumes": null,
    "initContainers": null,
    "containers": [
      {"name": "app", "image": "example/orders:1.4", "env": null,
       "lifecycle": {"postStart": {"exec": {"command": ["/bin/warm-up"]}}}},
      {"name": "second", "image": "example/second:1", "lifecycle": null}
    ]
  }
}`)
	var pod corev1.Pod
	if err := json.Unmarshal(raw, &pod); err != nil {
		t.Fatal(err)
	}
	ops, err := patchFor(raw, &pod, testConfig(), testToken)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	var out corev1.Pod
	if err := strictJSON(applyPatch(t, raw, patch), &out); err != nil {
		t.Fatal(err)
	}
	app := find(t, out.Spec.Containers, "app")
	if app.Lifecycle == nil || app.Lifecycle.PostStart == nil || app.Lifecycle.PreStop == nil || app.Lifecycle.PreStop.HTTPGet == nil {
		t.Errorf("app lifecycle %+v, want its postStart kept and the drain hook added", app.Lifecycle)
	}
	if len(app.Env) != 1 || app.Env[0].Name != envAdminAddr {
		t.Errorf("app env %+v, want the admin address in place of null", app.Env)
	}
	if l := find(t, out.Spec.Containers, "second").Lifecycle; l == nil || l.PreStop == nil {
		t.Errorf("second container lifecycle %+v, want the drain hook in place of null", l)
	}
	if len(out.Spec.Volumes) != 2 || len(out.Spec.InitContainers) != 1 {
		t.Errorf("volumes %d, init containers %d: want the sidecar's in place of null", len(out.Spec.Volumes), len(out.Spec.InitContainers))
	}
	if got := out.Annotations[istioExcludeOutbound]; got != "15020,5672" {
		t.Errorf("%s = %q, want the broker port added", istioExcludeOutbound, got)
	}
	if out.Annotations[annStatus] != "injected" || out.Name != "" {
		t.Errorf("status %q, name %q", out.Annotations[annStatus], out.Name)
	}
	checkSidecar(t, &out, find(t, out.Spec.InitContainers, containerName), 9400, 9464, "handoff.yaml")
}
