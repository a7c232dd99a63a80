package config

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in YAML as a Go duration string.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalYAML accepts only duration strings: "5" could mean seconds or
// nanoseconds, so a bare number is refused instead of guessed.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return fmt.Errorf("invalid duration %q: want a duration string such as 500ms, 5s or 1m", n.Value)
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("invalid duration %q: want a duration string such as 500ms, 5s or 1m", n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d back as a duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }
