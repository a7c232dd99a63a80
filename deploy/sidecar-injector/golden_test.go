package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"handoff.dev/handoff/internal/testkit"
)

// readPod reads testdata/name.yaml, and returns it as JSON too, as the API
// server would send it. A pod whose file is named future-* carries fields
// the injector's types do not know, and is decoded leniently.
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
	if err := decoderFor(name)(raw, &pod); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &pod, raw
}

func decoderFor(name string) func([]byte, any) error {
	if strings.HasPrefix(name, "future-") {
		return json.Unmarshal
	}
	return strictJSON
}

func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// applyGolden computes the pod's patch, compares it with the golden file
// (rewritten with -update), applies it to the pod's JSON, checks that the
// patch kept everything the pod had, and decodes the result (strictly,
// unless the pod carries unknown fields).
func applyGolden(t *testing.T, name string) (*corev1.Pod, *corev1.Pod, []byte) {
	t.Helper()
	pod, raw := readPod(t, name)
	ops, err := patchFor(raw, pod, testConfig(), testToken)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	// In the patch's order: an addition at an index depends on those
	// before it.
	indented, err := json.MarshalIndent(ops, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) == 0 {
		patch, indented = []byte("[]"), []byte("[]")
	}
	indented = append(indented, '\n')
	testkit.Golden(t, name+".patch.json", string(indented))
	doc := applyPatch(t, raw, patch)
	if !slices.ContainsFunc(ops, func(op operation) bool { return op.Op == "move" }) {
		keepsRequest(t, raw, doc) // a move reorders, and its test checks the order
	}
	var out corev1.Pod
	if err := decoderFor(name)(doc, &out); err != nil {
		t.Fatalf("%s: patched pod does not decode: %v", name, err)
	}
	return pod, &out, patch
}

// applyPatch applies a JSON patch with a real implementation of RFC 6902,
// to the pod as the API server sent it, not as re-encoded here.
func applyPatch(t *testing.T, raw, patch []byte) []byte {
	t.Helper()
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("patch does not decode: %v", err)
	}
	doc, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("patch does not apply: %v\n%s", err, patch)
	}
	return doc
}

// injectPod is the pod as the patch makes it, or the denial.
func injectPod(t *testing.T, pod *corev1.Pod, cfg Config) (*corev1.Pod, error) {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := patchFor(raw, pod, cfg, testToken)
	if err != nil {
		return nil, err
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	out := pod.DeepCopy()
	if len(ops) > 0 {
		*out = corev1.Pod{}
		if err := strictJSON(applyPatch(t, raw, patch), out); err != nil {
			t.Fatal(err)
		}
	}
	return out, nil
}

// mayChange are the paths whose value the injector may change, not only
// add to: the mesh annotations it adds ports to.
var mayChange = map[string]bool{
	pointer("metadata", "annotations", istioExcludeOutbound): true,
	pointer("metadata", "annotations", linkerdSkipOutbound):  true,
}

// keepsRequest checks that the patched pod holds everything the request
// did, unchanged: every member of every object, and every element of
// every array in its order (with the injector's elements between them).
func keepsRequest(t *testing.T, raw, patched []byte) {
	t.Helper()
	var before, after any
	if err := json.Unmarshal(raw, &before); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(patched, &after); err != nil {
		t.Fatal(err)
	}
	if path, ok := kept(before, after, ""); !ok {
		t.Errorf("the patch changed or dropped %s of the request", path)
	}
}

// kept reports whether after holds before, and where not.
func kept(before, after any, path string) (string, bool) {
	if mayChange[path] {
		return "", true
	}
	switch b := before.(type) {
	case map[string]any:
		a, ok := after.(map[string]any)
		if !ok {
			return path, false
		}
		for k, v := range b {
			av, ok := a[k]
			if !ok {
				return path + pointer(k), false
			}
			if p, ok := kept(v, av, path+pointer(k)); !ok {
				return p, false
			}
		}
		return "", true
	case []any:
		a, ok := after.([]any)
		if !ok {
			return path, false
		}
		j := 0
		for i, v := range b {
			for j < len(a) {
				if _, ok := kept(v, a[j], ""); ok {
					break
				}
				j++
			}
			if j == len(a) {
				return path + "/" + strconv.Itoa(i), false
			}
			j++
		}
		return "", true
	default:
		if !reflect.DeepEqual(before, after) {
			return path, false
		}
		return "", true
	}
}
