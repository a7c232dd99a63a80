package main

import (
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Config is the injector's own: what a pod gets when its annotations say
// nothing.
type Config struct {
	// Image is the sidecar's image.
	Image           string            `json:"image"`
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// Resources are the sidecar container's requests and limits.
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// AdminPort is the admin API's port, on the pod's loopback.
	AdminPort int32 `json:"adminPort,omitempty"`
	// MetricsPort serves /healthz, /readyz and /metrics to the kubelet's
	// probes and a scraper, on the pod's address.
	MetricsPort int32  `json:"metricsPort,omitempty"`
	LogLevel    string `json:"logLevel,omitempty"`
	// NativeSidecar runs the sidecar as an init container that keeps
	// running (Kubernetes 1.29 and later): it starts before the app and
	// stops after it.
	NativeSidecar bool `json:"nativeSidecar"`
	// DrainTimeout is the sidecar's shutdown.drain_timeout, set through
	// its environment: how long the app's preStop hook may wait for the
	// calls in flight.
	DrainTimeout metav1.Duration `json:"drainTimeout,omitempty"`
	// AppStopTime is what a pod's terminationGracePeriodSeconds must leave
	// the app after the drain, to stop once it is signalled: a pod whose
	// grace period is shorter than the drain and this is denied.
	AppStopTime metav1.Duration `json:"appStopTime,omitempty"`
}

// defaultConfig is the config before the file.
func defaultConfig() Config {
	return Config{
		ImagePullPolicy: corev1.PullIfNotPresent,
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			// The Kafka worst case with the sidecar's defaults is about
			// 330 MiB (345 MiB measured, docs/configuration.md): 256 records
			// handed out, the bodies of 64 calls in flight, a fetch.
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")},
		},
		AdminPort:     9400,
		MetricsPort:   9464,
		LogLevel:      "info",
		NativeSidecar: true,
		// 20 s and 10 s fit the grace period Kubernetes gives a pod that
		// names none (30 s).
		DrainTimeout: metav1.Duration{Duration: 20 * time.Second},
		AppStopTime:  metav1.Duration{Duration: 10 * time.Second},
	}
}

// loadConfig reads the injector's config file over the defaults, strictly:
// an unknown key is an error.
func loadConfig(path string) (Config, error) {
	cfg := defaultConfig()
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("injector config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, fmt.Errorf("injector config %s: %w", path, err)
	}
	return cfg, cfg.validate()
}

func (c Config) validate() error {
	switch {
	case c.Image == "":
		return fmt.Errorf("injector config: image: required (the sidecar's image)")
	case c.AdminPort < 1 || c.AdminPort > 65535:
		return fmt.Errorf("injector config: adminPort: %d is not a port", c.AdminPort)
	case c.MetricsPort < 1 || c.MetricsPort > 65535:
		return fmt.Errorf("injector config: metricsPort: %d is not a port", c.MetricsPort)
	case c.AdminPort == c.MetricsPort:
		return fmt.Errorf("injector config: adminPort and metricsPort are both %d", c.AdminPort)
	case c.DrainTimeout.Duration <= 0:
		return fmt.Errorf("injector config: drainTimeout: %v is not a positive duration", c.DrainTimeout.Duration)
	case c.AppStopTime.Duration < 0:
		return fmt.Errorf("injector config: appStopTime: %v is negative", c.AppStopTime.Duration)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("injector config: logLevel: %q is not debug, info, warn or error", c.LogLevel)
	}
	return nil
}
