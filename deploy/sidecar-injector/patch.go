package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// operation is one JSON patch (RFC 6902) operation.
type operation struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	From  string `json:"from,omitempty"`
	Value any    `json:"value,omitempty"`
}

// pointer is the JSON pointer (RFC 6901) of the object path, each token
// escaped: "handoff.dev/status" is "handoff.dev~1status".
func pointer(tokens ...string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}

// patchFor is the JSON patch that injects the sidecar into the pod: raw as
// the API server sent it, pod decoded from it. It is made of additions
// only (and, on a reinvocation, the move of the sidecar the injector added
// before), each at a path of the object as the server holds it: the patch
// never writes a field it does not add, so a field the injector's types do
// not know, a default the server applied, a name still to be generated,
// all stay as they are. Empty when nothing changes.
//
// newToken makes the pod's drain token: its preStop hooks send it to
// /drain, which refuses a request without it.
func patchFor(raw []byte, pod *corev1.Pod, cfg Config, newToken func() string) ([]operation, error) {
	if !wants(pod) {
		// Only a bad inject annotation denies a pod that is not asking.
		return nil, checkInject(pod)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("handoff sidecar injector: the pod could not be read: %w", err)
	}
	if injected(pod) {
		// Called again (reinvocationPolicy IfNeeded) after a mesh's
		// injector added its native proxy after Handoff: move Handoff
		// behind it. Nothing else of an injected pod changes.
		ics := pod.Spec.InitContainers
		at := slices.IndexFunc(ics, func(c corev1.Container) bool { return c.Name == containerName })
		if to := afterMeshProxy(ics); at >= 0 && to > at+1 {
			// A move removes first: the proxy is one to the left when
			// the sidecar is added back, right behind it.
			return []operation{{Op: "move", From: pointer("spec", "initContainers", strconv.Itoa(at)), Path: pointer("spec", "initContainers", strconv.Itoa(to-1))}}, nil
		}
		return nil, nil
	}
	o, err := readOptions(pod, cfg)
	if err != nil {
		return nil, err
	}
	// A pod of a StatefulSet whose volumeClaimTemplates name one
	// handoff-journal has its own claim already: the journal goes there.
	ownJournal := slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == journalVolume })
	if ownJournal && o.claim != "" {
		return nil, &Denial{annJournalClaim, "the pod has a volume " + journalVolume + " of its own already", "remove the annotation to keep the journal on that volume, or rename the volume"}
	}

	var ops []operation
	token := newToken()
	c := o.container(cfg, token)
	if o.native {
		always := corev1.ContainerRestartPolicyAlways
		c.RestartPolicy = &always
		// First, so it starts before the app's init containers need it;
		// then after a mesh proxy that is a native sidecar too.
		ops = appendTo(ops, doc, []string{"spec", "initContainers"}, afterMeshProxy(pod.Spec.InitContainers), c)
	} else {
		ops = appendTo(ops, doc, []string{"spec", "containers"}, -1, c)
	}
	for _, v := range o.volumes(!ownJournal) {
		ops = appendTo(ops, doc, []string{"spec", "volumes"}, -1, v)
	}

	// The app finds the admin API on localhost, and its stop waits for
	// Handoff's drain: Kubernetes runs a container's preStop hook before
	// it signals it, and /drain answers once intake has stopped and the
	// calls in flight are done. The hook is an httpGet, which the kubelet
	// sends (an image without a shell can have it), carrying the drain
	// token. A hook of the app's own is left alone, and gets the token
	// in its environment to send itself.
	addr := fmt.Sprintf("127.0.0.1:%d", o.adminPort)
	for i, ct := range pod.Spec.Containers {
		if isMeshProxy(ct) {
			continue
		}
		at := []string{"spec", "containers", strconv.Itoa(i)}
		ownHook := ct.Lifecycle != nil && ct.Lifecycle.PreStop != nil
		for _, e := range []corev1.EnvVar{{Name: envAdminAddr, Value: addr}, {Name: envDrainToken, Value: token}} {
			if e.Name == envDrainToken && !ownHook || slices.ContainsFunc(ct.Env, func(have corev1.EnvVar) bool { return have.Name == e.Name }) {
				continue
			}
			ops = appendTo(ops, doc, append(at, "env"), -1, e)
		}
		if !ownHook {
			hook := &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/drain", Port: intstr.FromInt32(o.metricsPort),
				HTTPHeaders: []corev1.HTTPHeader{{Name: "Authorization", Value: "Bearer " + token}},
			}}
			ops = setIn(ops, doc, append(at, "lifecycle", "preStop"), hook)
		}
	}

	annotations := [][2]string{}
	if len(o.excludePorts) > 0 {
		for _, ann := range []string{istioExcludeOutbound, linkerdSkipOutbound} {
			annotations = append(annotations, [2]string{ann, mergePorts(pod.Annotations[ann], o.excludePorts)})
		}
	}
	annotations = append(annotations, [2]string{annStatus, "injected"})
	for _, a := range annotations {
		ops = setIn(ops, doc, []string{"metadata", "annotations", a[0]}, a[1])
	}
	return ops, nil
}

// afterMeshProxy is where the native sidecar goes among the init
// containers: right after the last mesh proxy that is a native sidecar
// too, so the proxy is up before Handoff dials the broker through it;
// first when there is none.
func afterMeshProxy(ics []corev1.Container) int {
	at := 0
	for i, c := range ics {
		if isMeshProxy(c) && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			at = i + 1
		}
	}
	return at
}

// appendTo adds v to the array at path in doc: at index at, or at its end
// when at is -1; the whole array [v] when the array is not there, which is
// the only way to make one (a patch cannot add to what does not exist). The
// same call for the same path again appends after the first.
func appendTo(ops []operation, doc map[string]any, path []string, at int, v any) []operation {
	if !present(doc, ops, path) {
		return append(ops, operation{Op: "add", Path: pointer(path...), Value: []any{v}})
	}
	idx := "-"
	if at >= 0 {
		idx = strconv.Itoa(at)
	}
	return append(ops, operation{Op: "add", Path: pointer(append(slices.Clip(path), idx)...), Value: v})
}

// setIn sets the object member at path to v, adding the objects above it
// that are missing as one object holding the rest of the path.
func setIn(ops []operation, doc map[string]any, path []string, v any) []operation {
	n := len(path) - 1
	for n > 0 && !present(doc, ops, path[:n]) {
		n--
	}
	// path[:n] is there: wrap v in an object for each member below it.
	for i := len(path) - 1; i > n; i-- {
		v = map[string]any{path[i]: v}
	}
	return append(ops, operation{Op: "add", Path: pointer(path[:n+1]...), Value: v})
}

// present reports whether path leads to a value other than null in doc, or
// is one that an operation in ops adds.
func present(doc map[string]any, ops []operation, path []string) bool {
	p := pointer(path...)
	for _, op := range ops {
		if op.Op == "add" && (op.Path == p || strings.HasPrefix(p, op.Path+"/")) {
			return true
		}
	}
	var cur any = doc
	for _, tok := range path {
		switch v := cur.(type) {
		case map[string]any:
			cur = v[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return false
			}
			cur = v[i]
		default:
			return false
		}
		if cur == nil {
			return false
		}
	}
	return true
}
