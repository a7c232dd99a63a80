package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The annotations a pod asks for Handoff with. Only inject is required; the
// rest default to the injector's config.
const (
	annInject       = "handoff.dev/inject"
	annConfig       = "handoff.dev/config"
	annConfigKey    = "handoff.dev/config-key"
	annToken        = "handoff.dev/admin-token-secret"
	annNative       = "handoff.dev/native-sidecar"
	annImage        = "handoff.dev/image"
	annCPURequest   = "handoff.dev/cpu-request"
	annCPULimit     = "handoff.dev/cpu-limit"
	annMemRequest   = "handoff.dev/memory-request"
	annMemLimit     = "handoff.dev/memory-limit"
	annAdminPort    = "handoff.dev/admin-port"
	annMetricsPort  = "handoff.dev/metrics-port"
	annLogLevel     = "handoff.dev/log-level"
	annJournalClaim = "handoff.dev/journal-claim"
	annBrokerPorts  = "handoff.dev/exclude-outbound-ports"
	annDrain        = "handoff.dev/drain-timeout"
	// annStatus marks a pod this injector changed: seeing it, a second
	// call (a reinvocation, a retried request) changes nothing.
	annStatus = "handoff.dev/status"
)

// The mesh proxies' own annotations for outbound ports their interception
// leaves alone; exclude-outbound-ports adds the broker ports to each.
const (
	istioExcludeOutbound = "traffic.sidecar.istio.io/excludeOutboundPorts"
	linkerdSkipOutbound  = "config.linkerd.io/skip-outbound-ports"
	istioProxyName       = "istio-proxy"
	linkerdProxyName     = "linkerd-proxy"
	containerName        = "handoff"
	configVolume         = "handoff-config"
	journalVolume        = "handoff-journal"
	configDir            = "/etc/handoff"
	journalDir           = "/var/lib/handoff"
	tokenSecretKey       = "token"
	defaultConfigKey     = "handoff.yaml"
	envAdminAddr         = "HANDOFF_ADMIN_ADDR"
	// envDrainToken is the pod's drain token, in the sidecar's environment
	// (where /drain requires it) and in an app container's with a preStop
	// hook of its own.
	envDrainToken = "HANDOFF_DRAIN_TOKEN"
)

// Denial is a pod refused: the annotation at fault and how to fix it.
type Denial struct {
	Annotation string
	Problem    string
	Fix        string
}

func (d *Denial) Error() string {
	return fmt.Sprintf("handoff sidecar injector: annotation %s: %s; %s", d.Annotation, d.Problem, d.Fix)
}

// wants reports whether the pod asks for injection.
func wants(pod *corev1.Pod) bool {
	return pod.Annotations[annInject] == "true"
}

// boolAnnotation reads an annotation that is "true" or "false", spelt so:
// Kubernetes' own boolean annotations are, and a "1", "True" or "yes" that
// one tool reads as true and another as false is refused instead.
func boolAnnotation(v string) (bool, bool) {
	switch v {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// checkInject denies a pod whose inject annotation is neither true nor
// false.
func checkInject(pod *corev1.Pod) error {
	if v, ok := pod.Annotations[annInject]; ok {
		if _, ok := boolAnnotation(v); !ok {
			return &Denial{annInject, fmt.Sprintf(`%q is not "true" or "false"`, v), `write "true" to inject the sidecar, or remove the annotation`}
		}
	}
	return nil
}

// injected reports whether the pod already carries the sidecar: this
// injector's mark, or a container of its name.
func injected(pod *corev1.Pod) bool {
	if pod.Annotations[annStatus] == "injected" {
		return true
	}
	has := func(cs []corev1.Container) bool {
		return slices.ContainsFunc(cs, func(c corev1.Container) bool { return c.Name == containerName })
	}
	return has(pod.Spec.InitContainers) || has(pod.Spec.Containers)
}

// options are one pod's choices: its annotations over the config's
// defaults.
type options struct {
	config, configKey, tokenSecret, claim string
	native                                bool
	image, logLevel                       string
	adminPort, metricsPort                int32
	resources                             corev1.ResourceRequirements
	excludePorts                          []int32
	drain                                 time.Duration
}

// readOptions reads the pod's annotations over cfg. The first bad one is a
// Denial.
func readOptions(pod *corev1.Pod, cfg Config) (options, error) {
	a := pod.Annotations
	o := options{
		config: a[annConfig], configKey: cmp(a[annConfigKey], defaultConfigKey), tokenSecret: a[annToken],
		claim: a[annJournalClaim], native: cfg.NativeSidecar, image: cmp(a[annImage], cfg.Image),
		logLevel: cmp(a[annLogLevel], cfg.LogLevel), adminPort: cfg.AdminPort, metricsPort: cfg.MetricsPort,
		resources: *cfg.Resources.DeepCopy(), drain: cfg.DrainTimeout.Duration,
	}
	if err := checkInject(pod); err != nil {
		return o, err
	}
	if o.config == "" {
		return o, &Denial{annConfig, "missing: the sidecar needs its config", "name the ConfigMap that holds the sidecar's config (key " + defaultConfigKey + ", or the one handoff.dev/config-key names)"}
	}
	for _, n := range []struct{ ann, v string }{{annConfig, o.config}, {annToken, o.tokenSecret}, {annJournalClaim, o.claim}} {
		if n.v == "" {
			continue
		}
		if errs := validation.IsDNS1123Subdomain(n.v); len(errs) > 0 {
			return o, &Denial{n.ann, fmt.Sprintf("%q is not an object name: %s", n.v, strings.Join(errs, "; ")), "name an object in the pod's namespace"}
		}
	}
	if errs := validation.IsConfigMapKey(o.configKey); len(errs) > 0 {
		return o, &Denial{annConfigKey, fmt.Sprintf("%q is not a ConfigMap key: %s", o.configKey, strings.Join(errs, "; ")), "name the key of the ConfigMap that holds the config"}
	}
	if v, ok := a[annNative]; ok {
		b, ok := boolAnnotation(v)
		if !ok {
			return o, &Denial{annNative, fmt.Sprintf(`%q is not "true" or "false"`, v), `write "false" to run the sidecar as a plain container (Kubernetes before 1.29), or remove the annotation`}
		}
		o.native = b
	}
	switch o.logLevel {
	case "debug", "info", "warn", "error":
	default:
		return o, &Denial{annLogLevel, fmt.Sprintf("%q is not a log level", o.logLevel), "write debug, info, warn or error"}
	}
	for _, p := range []struct {
		ann string
		to  *int32
	}{{annAdminPort, &o.adminPort}, {annMetricsPort, &o.metricsPort}} {
		v, ok := a[p.ann]
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 || n > 65535 {
			return o, &Denial{p.ann, fmt.Sprintf("%q is not a port", v), "write a port number from 1 to 65535"}
		}
		*p.to = int32(n)
	}
	if o.adminPort == o.metricsPort {
		return o, &Denial{annMetricsPort, fmt.Sprintf("port %d is the admin port too", o.metricsPort), "give the admin API and the metrics different ports"}
	}
	for _, q := range []struct {
		ann  string
		list corev1.ResourceList
		name corev1.ResourceName
	}{
		{annCPURequest, o.requests(), corev1.ResourceCPU}, {annCPULimit, o.limits(), corev1.ResourceCPU},
		{annMemRequest, o.requests(), corev1.ResourceMemory}, {annMemLimit, o.limits(), corev1.ResourceMemory},
	} {
		v, ok := a[q.ann]
		if !ok {
			continue
		}
		qty, err := resource.ParseQuantity(v)
		if err != nil || qty.Sign() <= 0 {
			return o, &Denial{q.ann, fmt.Sprintf("%q is not a positive quantity", v), `write a Kubernetes quantity, such as "250m" of CPU or "128Mi" of memory`}
		}
		q.list[q.name] = qty
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okr := o.resources.Requests[name]
		lim, okl := o.resources.Limits[name]
		if okr && okl && req.Cmp(lim) > 0 {
			return o, &Denial{"handoff.dev/" + string(name) + "-request", fmt.Sprintf("request %s is above limit %s", req.String(), lim.String()), "lower the request or raise the limit"}
		}
	}
	if v, ok := a[annDrain]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second || d > time.Hour {
			return o, &Denial{annDrain, fmt.Sprintf("%q is not a duration from 1s to 1h", v), `write how long the drain may take, such as "20s"`}
		}
		o.drain = d
	}
	if err := o.checkGrace(pod, cfg.AppStopTime.Duration); err != nil {
		return o, err
	}
	if v, ok := a[annBrokerPorts]; ok {
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
			if err != nil || n < 1 || n > 65535 {
				return o, &Denial{annBrokerPorts, fmt.Sprintf("%q is not a port", strings.TrimSpace(f)), `write the broker ports separated by commas, such as "5672,9092"`}
			}
			o.excludePorts = append(o.excludePorts, int32(n))
		}
	}
	return o, nil
}

// defaultGrace is terminationGracePeriodSeconds when a pod names none:
// the API server's default, which it has applied before admission.
const defaultGrace = 30 * time.Second

// checkGrace denies a pod whose grace period would not leave the app
// appStop after the drain. On a pod's deletion the kubelet runs the app's
// preStop hook, which waits for the drain; only then does it signal the
// app, and the grace period counts all of it: a grace period no longer
// than the drain leaves the app killed mid-stop, or the drain cut short.
func (o options) checkGrace(pod *corev1.Pod, appStop time.Duration) error {
	grace := defaultGrace
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	need := o.drain + appStop
	if grace >= need {
		return nil
	}
	return &Denial{annDrain,
		fmt.Sprintf("terminationGracePeriodSeconds %d leaves the app %v to stop after the sidecar's drain (shutdown.drain_timeout %v), less than the %v it needs",
			int64(grace/time.Second), max(grace-o.drain, 0), o.drain, appStop),
		fmt.Sprintf("set terminationGracePeriodSeconds to at least %d, or a shorter drain with this annotation", int64((need+time.Second-1)/time.Second))}
}

func (o *options) requests() corev1.ResourceList {
	if o.resources.Requests == nil {
		o.resources.Requests = corev1.ResourceList{}
	}
	return o.resources.Requests
}

func (o *options) limits() corev1.ResourceList {
	if o.resources.Limits == nil {
		o.resources.Limits = corev1.ResourceList{}
	}
	return o.resources.Limits
}

func cmp(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

func isMeshProxy(c corev1.Container) bool {
	return c.Name == istioProxyName || c.Name == linkerdProxyName
}

// mergePorts adds ports to a comma-separated list, keeping what is there.
func mergePorts(list string, ports []int32) string {
	var out []string
	for f := range strings.SplitSeq(list, ",") {
		if f = strings.TrimSpace(f); f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	for _, p := range ports {
		if s := strconv.Itoa(int(p)); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return strings.Join(out, ",")
}

// container is the sidecar's container for the pod.
func (o options) container(cfg Config, drainToken string) corev1.Container {
	env := []corev1.EnvVar{
		{Name: "HANDOFF_JOURNAL_PATH", Value: journalDir + "/journal.db"},
		{Name: "HANDOFF_INSTANCE_ID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		// Probes come from the kubelet, to the pod's address.
		{Name: "HANDOFF_METRICS_LISTEN", Value: fmt.Sprintf("0.0.0.0:%d", o.metricsPort)},
		// The admin API has no TLS: it stays on the pod's loopback.
		{Name: "HANDOFF_ADMIN_LISTEN", Value: fmt.Sprintf("127.0.0.1:%d", o.adminPort)},
		// GET /drain, for the app containers' preStop hooks, which send
		// the token: without it, anyone who reaches the pod could stop
		// its consumer.
		{Name: "HANDOFF_HTTP_DRAIN", Value: "true"},
		{Name: envDrainToken, Value: drainToken},
		// The drain the grace period was checked against, whatever the
		// ConfigMap says.
		{Name: "HANDOFF_DRAIN_TIMEOUT", Value: o.drain.String()},
	}
	if lim, ok := o.resources.Limits[corev1.ResourceMemory]; ok {
		// The Go runtime collects harder as the heap nears this, instead of
		// growing to twice what is live: garbage does not take the
		// container past its limit. A tenth is left for what is not heap.
		env = append(env, corev1.EnvVar{Name: "GOMEMLIMIT", Value: fmt.Sprintf("%dMiB", lim.Value()*9/10>>20)})
	}
	if o.tokenSecret != "" {
		env = append(env, corev1.EnvVar{Name: "HANDOFF_ADMIN_TOKEN", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: o.tokenSecret}, Key: tokenSecretKey}}})
	}
	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("handoff-metrics")}},
			PeriodSeconds:    period,
			FailureThreshold: failures,
			TimeoutSeconds:   2,
		}
	}
	nonRoot, noEscalation, readOnly := true, false, true
	uid := int64(65532)
	c := corev1.Container{
		Name:            containerName,
		Image:           o.image,
		ImagePullPolicy: cfg.ImagePullPolicy,
		Args:            []string{"run", "--config", configDir + "/" + o.configKey, "--log-level", o.logLevel, "--log-format", "json"},
		Env:             env,
		Ports: []corev1.ContainerPort{
			{Name: "handoff-metrics", ContainerPort: o.metricsPort, Protocol: corev1.ProtocolTCP},
		},
		Resources: o.resources,
		VolumeMounts: []corev1.VolumeMount{
			{Name: configVolume, MountPath: configDir, ReadOnly: true},
			{Name: journalVolume, MountPath: journalDir},
		},
		// A native sidecar's startup probe holds back the app's start:
		// it asks only that the process serves, /drain with it, never for
		// the app (which cannot answer before it starts) or the broker.
		// Two minutes is for a large journal's recovery.
		StartupProbe: probe("/startupz", 1, 120),
		// The sidecar's readiness is part of the pod's, which a Service
		// routes the app's traffic on: it says only that the sidecar is
		// not stopping. A broker outage, or the app away, would take
		// every replica out of its Service and stall a rollout, and the
		// app serves without the broker.
		ReadinessProbe: probe("/runningz", 5, 3),
		// A restart mends a wedged process, never a broker or app away.
		LivenessProbe: probe("/healthz", 10, 3),
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot: &nonRoot, RunAsUser: &uid, AllowPrivilegeEscalation: &noEscalation, ReadOnlyRootFilesystem: &readOnly,
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			// Pod Security "restricted" wants it of every container whose
			// pod does not set it for all.
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	return c
}

// volumes are the sidecar's config volume, and its journal's when journal
// is set.
func (o options) volumes(journal bool) []corev1.Volume {
	mode := int32(0o444)
	vols := []corev1.Volume{
		{Name: configVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: o.config}, DefaultMode: &mode}}},
	}
	if !journal {
		return vols
	}
	j := corev1.Volume{Name: journalVolume}
	if o.claim != "" {
		j.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: o.claim}
	} else {
		j.EmptyDir = &corev1.EmptyDirVolumeSource{}
	}
	return append(vols, j)
}
