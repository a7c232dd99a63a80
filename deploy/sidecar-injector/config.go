package main

import (
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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
}

// defaultConfig is the config before the file.
func defaultConfig() Config {
	return Config{
		ImagePullPolicy: corev1.PullIfNotPresent,
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
		},
		AdminPort:     9400,
		MetricsPort:   9464,
		LogLevel:      "info",
		NativeSidecar: true,
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
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("injector config: logLevel: %q is not debug, info, warn or error", c.LogLevel)
	}
	return nil
}
