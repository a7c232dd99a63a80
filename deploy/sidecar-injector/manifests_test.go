package main

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"handoff.dev/handoff/internal/config"
)

// built is the kustomization's output, each object decoded strictly into
// its Kubernetes type, by kind and name.
type built struct {
	objects map[string]any // "Kind/namespace/name"
	caPEM   []byte
}

// buildManifests builds a copy of manifests/ with certificates made for
// it, as `kubectl apply -k` would after `sidecar-injector certs`.
func buildManifests(t *testing.T) built {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "manifests")
	err := filepath.WalkDir("manifests", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("manifests", path)
		if d.IsDir() {
			if rel == "tls" {
				return filepath.SkipDir // a local certificate is not the test's
			}
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writeCerts(filepath.Join(dir, "tls"), serviceNames("handoff-injector", "handoff-system"), certOptions{validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "tls", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	types := map[string]func() any{
		"Namespace":                    func() any { return &corev1.Namespace{} },
		"ServiceAccount":               func() any { return &corev1.ServiceAccount{} },
		"ConfigMap":                    func() any { return &corev1.ConfigMap{} },
		"Secret":                       func() any { return &corev1.Secret{} },
		"Service":                      func() any { return &corev1.Service{} },
		"Deployment":                   func() any { return &appsv1.Deployment{} },
		"StatefulSet":                  func() any { return &appsv1.StatefulSet{} },
		"PodDisruptionBudget":          func() any { return &policyv1.PodDisruptionBudget{} },
		"MutatingWebhookConfiguration": func() any { return &admissionregistrationv1.MutatingWebhookConfiguration{} },
	}
	b := built{objects: map[string]any{}, caPEM: caPEM}
	for _, r := range res.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		mk, ok := types[r.GetKind()]
		if !ok {
			t.Errorf("%s %s: a kind this test does not know", r.GetKind(), r.GetName())
			continue
		}
		obj := mk()
		if err := strictJSON(data, obj); err != nil {
			t.Errorf("%s %s does not decode strictly: %v", r.GetKind(), r.GetName(), err)
			continue
		}
		b.objects[r.GetKind()+"/"+r.GetNamespace()+"/"+r.GetName()] = obj
	}
	return b
}

func get[T any](t *testing.T, b built, key string) T {
	t.Helper()
	obj, ok := b.objects[key].(T)
	if !ok {
		keys := make([]string, 0, len(b.objects))
		for k := range b.objects {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		t.Fatalf("no %s among %v", key, keys)
	}
	return obj
}

// The manifests build with kustomize, every object decodes strictly into its
// type, and they fit together: the webhook calls the Service, which selects
// the Deployment's pods, which serve the certificate the webhook's CA
// signed; the injector's config and the example's sidecar config load; and
// the example's pods are injected.
func TestManifestsBuild(t *testing.T) {
	b := buildManifests(t)
	wh := get[*admissionregistrationv1.MutatingWebhookConfiguration](t, b, "MutatingWebhookConfiguration//handoff-sidecar-injector")
	if len(wh.Webhooks) != 1 {
		t.Fatalf("%d webhooks, want 1", len(wh.Webhooks))
	}
	w := wh.Webhooks[0]
	if !bytes.Equal(w.ClientConfig.CABundle, b.caPEM) {
		t.Error("caBundle is not the CA the certificate was made with")
	}
	if w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNone ||
		w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Fail ||
		w.ReinvocationPolicy == nil || *w.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
		t.Errorf("webhook policies %v %v %v, want sideEffects None, failurePolicy Fail, reinvocation IfNeeded", w.SideEffects, w.FailurePolicy, w.ReinvocationPolicy)
	}
	if w.NamespaceSelector == nil || w.NamespaceSelector.MatchLabels["handoff.dev/injection"] != "enabled" {
		t.Errorf("namespace selector %+v, want the opt-in label", w.NamespaceSelector)
	}
	if w.ObjectSelector == nil || len(w.ObjectSelector.MatchExpressions) != 1 || w.ObjectSelector.MatchExpressions[0].Key != "handoff.dev/injection" {
		t.Errorf("object selector %+v, want pods labelled out left alone", w.ObjectSelector)
	}
	ref := w.ClientConfig.Service
	if ref == nil || ref.Path == nil || *ref.Path != "/mutate" {
		t.Fatalf("client config %+v, want the Service's /mutate", w.ClientConfig)
	}
	svc := get[*corev1.Service](t, b, "Service/"+ref.Namespace+"/"+ref.Name)
	dep := get[*appsv1.Deployment](t, b, "Deployment/handoff-system/handoff-injector")
	if dep.Spec.Template.Labels["handoff.dev/injection"] != "disabled" {
		t.Error("the injector's own pods are not labelled out of injection")
	}
	for k, v := range svc.Spec.Selector {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("the Service selects %s=%s, which the injector's pods do not carry", k, v)
		}
	}
	secret := get[*corev1.Secret](t, b, "Secret/handoff-system/handoff-injector-tls")
	if secret.Type != corev1.SecretTypeTLS || len(secret.Data["tls.crt"]) == 0 || len(secret.Data["tls.key"]) == 0 {
		t.Errorf("TLS secret %s with keys %v", secret.Type, slices.Collect(maps.Keys(secret.Data)))
	}
	var tlsVol, cfgVol string
	for _, v := range dep.Spec.Template.Spec.Volumes {
		switch {
		case v.Secret != nil:
			tlsVol = v.Secret.SecretName
		case v.ConfigMap != nil:
			cfgVol = v.ConfigMap.Name
		}
	}
	if tlsVol != secret.Name {
		t.Errorf("the Deployment mounts Secret %q, not %q", tlsVol, secret.Name)
	}
	// A subPath mount never sees a change of its ConfigMap or Secret: the
	// injector's reloads would reload nothing.
	for _, c := range dep.Spec.Template.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.SubPath != "" || m.SubPathExpr != "" {
				t.Errorf("container %s mounts %s with a subPath: changes to it never reach the pod", c.Name, m.Name)
			}
		}
		for _, a := range c.Args {
			for _, flag := range []string{"-config=", "-tls-cert=", "-tls-key="} {
				p, ok := strings.CutPrefix(a, flag)
				if ok && !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(p, m.MountPath+"/") }) {
					t.Errorf("%s%s is on no volume the container mounts", flag, p)
				}
			}
		}
	}
	get[*corev1.ServiceAccount](t, b, "ServiceAccount/handoff-system/"+dep.Spec.Template.Spec.ServiceAccountName)
	pdb := get[*policyv1.PodDisruptionBudget](t, b, "PodDisruptionBudget/handoff-system/handoff-injector")
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 || *dep.Spec.Replicas <= int32(pdb.Spec.MinAvailable.IntValue()) {
		t.Errorf("PDB minAvailable %v with %d replicas: a drain could not proceed, or could leave none", pdb.Spec.MinAvailable, *dep.Spec.Replicas)
	}

	// The injector's own config loads.
	cm := get[*corev1.ConfigMap](t, b, "ConfigMap/handoff-system/"+cfgVol)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(path)
	if err != nil {
		t.Fatalf("the injector's ConfigMap: %v", err)
	}

	// The example: its namespace opts in, its pods are injected, and the
	// sidecar's config it names loads with what the injector sets.
	if ns := get[*corev1.Namespace](t, b, "Namespace//shop"); ns.Labels["handoff.dev/injection"] != "enabled" {
		t.Errorf("the example's namespace labels %v, want the opt-in", ns.Labels)
	}
	sts := get[*appsv1.StatefulSet](t, b, "StatefulSet/shop/orders")
	pod := &corev1.Pod{ObjectMeta: sts.Spec.Template.ObjectMeta, Spec: sts.Spec.Template.Spec}
	pod.Name = "orders-0"
	out, err := injectPod(t, pod, cfg)
	if err != nil {
		t.Fatalf("the example's pod is not injected: %v", err)
	}
	c := find(t, out.Spec.InitContainers, "handoff")
	sidecarCM := get[*corev1.ConfigMap](t, b, "ConfigMap/shop/"+pod.Annotations[annConfig])
	key := strings.TrimPrefix(c.Args[slices.Index(c.Args, "--config")+1], configDir+"/")
	yamlText, ok := sidecarCM.Data[key]
	if !ok {
		t.Fatalf("the sidecar reads key %q, which ConfigMap %s lacks", key, sidecarCM.Name)
	}
	env := map[string]string{"HANDOFF_INSTANCE_ID": pod.Name}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	if tok := pod.Annotations[annToken]; tok != "" {
		s := get[*corev1.Secret](t, b, "Secret/shop/"+tok)
		env["HANDOFF_ADMIN_TOKEN"] = s.StringData[tokenSecretKey] + string(s.Data[tokenSecretKey])
	}
	spath := filepath.Join(t.TempDir(), key)
	if err := os.WriteFile(spath, []byte(yamlText), 0o600); err != nil {
		t.Fatal(err)
	}
	scfg, err := config.LoadEnv(spath, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("the example's sidecar config: %v", err)
	}
	if scfg.Journal.Path != journalDir+"/journal.db" || !scfg.Admin.Enabled() {
		t.Errorf("the example's sidecar: journal %q, admin API on %v", scfg.Journal.Path, scfg.Admin.Enabled())
	}
	if _, err := json.Marshal(out); err != nil {
		t.Fatal(err)
	}
}
