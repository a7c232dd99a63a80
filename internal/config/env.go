package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Environment overrides are what a platform sets per pod and a config file
// shared by many pods (a ConfigMap) cannot say: where this pod's journal
// volume is mounted, its name for Kafka's static membership, the listeners
// its probes reach. Each variable names one key; set and not empty, it
// replaces the file's value before validation, and a problem with the value
// names the variable beside the key.
var envOverrides = []struct {
	name, path string
	set        func(c *Config, v string) error
}{
	{"HANDOFF_JOURNAL_PATH", "journal.path", func(c *Config, v string) error { c.Journal.Path = v; return nil }},
	{"HANDOFF_ADMIN_LISTEN", "admin.listen", func(c *Config, v string) error { c.Admin.Listen = v; return nil }},
	{"HANDOFF_ADMIN_TOKEN_FILE", "admin.token_file", func(c *Config, v string) error { c.Admin.TokenFile = v; return nil }},
	{"HANDOFF_ADMIN_TOKEN", "admin.token_file", func(c *Config, v string) error {
		c.Admin.Token, c.Admin.TokenFile = strings.TrimSpace(v), ""
		return nil
	}},
	{"HANDOFF_METRICS_LISTEN", "telemetry.metrics_listen", func(c *Config, v string) error { c.Telemetry.MetricsListen = v; return nil }},
	{"HANDOFF_INSTANCE_ID", "sources[*].kafka.instance_id", func(c *Config, v string) error { c.setInstanceID(v); return nil }},
	{"HANDOFF_DRAIN_TIMEOUT", "shutdown.drain_timeout", func(c *Config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("want a duration such as 20s, got %q", v)
		}
		c.Shutdown.DrainTimeout = Duration(d)
		return nil
	}},
	{"HANDOFF_DRAIN_TOKEN", "shutdown.drain_token", func(c *Config, v string) error {
		c.Shutdown.DrainToken = strings.TrimSpace(v)
		return nil
	}},
	{"HANDOFF_HTTP_DRAIN", "shutdown.http_drain", func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", v)
		}
		c.Shutdown.HTTPDrain = b
		return nil
	}},
}

// EnvNames lists the environment variables the config reads, with the key
// each sets.
func EnvNames() [][2]string {
	out := make([][2]string, len(envOverrides))
	for i, o := range envOverrides {
		out[i] = [2]string{o.name, o.path}
	}
	return out
}

// LoadEnv is Load with the overrides of the environment lookup reads (nil:
// the process's own).
func LoadEnv(path string, lookup func(string) (string, bool)) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	return parse(data, lookup)
}

// applyEnv sets the keys the environment overrides, and returns the YAML
// path of each with the variable that set it, and a problem for each value
// that does not parse.
func (c *Config) applyEnv(lookup func(string) (string, bool)) (map[string]string, Problems) {
	if lookup == nil {
		return nil, nil
	}
	set := map[string]string{}
	var ps Problems
	for _, o := range envOverrides {
		if v, ok := lookup(o.name); ok && v != "" {
			if err := o.set(c, v); err != nil {
				ps.add(o.path, "%v (set by %s)", err, o.name)
				continue
			}
			set[o.path] = o.name
		}
	}
	return set, ps
}

// setInstanceID gives every Kafka source without an instance_id the id v,
// followed by the source's name where another source of the same group
// takes it too: an id must be unique in its group.
func (c *Config) setInstanceID(v string) {
	groups := map[string]int{}
	for _, s := range c.Sources {
		if s.Kafka != nil && s.Kafka.InstanceID == "" {
			groups[s.Kafka.Group]++
		}
	}
	for _, s := range c.Sources {
		// A share group has no static members.
		if k := s.Kafka; k != nil && k.InstanceID == "" && k.ShareGroup == "" {
			k.InstanceID = v
			if groups[k.Group] > 1 {
				k.InstanceID = v + "-" + idSafe(s.Name)
			}
		}
	}
}

// idSafe replaces what a Kafka instance id cannot hold with '-'.
func idSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '-'
	}, s)
}

// blameEnv adds to each problem at a key the environment set the variable
// that set it.
func blameEnv(ps Problems, set map[string]string) {
	for i, p := range ps {
		for path, name := range set {
			if p.Path == path || matchesSourcePath(p.Path, path) {
				ps[i].Message += fmt.Sprintf(" (set by %s)", name)
			}
		}
	}
}

// matchesSourcePath reports whether path ("sources[2].kafka.instance_id")
// is an instance of pattern ("sources[*].kafka.instance_id").
func matchesSourcePath(path, pattern string) bool {
	pre, post, ok := strings.Cut(pattern, "[*]")
	if !ok || !strings.HasPrefix(path, pre+"[") || !strings.HasSuffix(path, post) {
		return false
	}
	idx := path[len(pre)+1 : len(path)-len(post)]
	return strings.HasSuffix(idx, "]") && len(idx) > 1 && strings.Trim(idx[:len(idx)-1], "0123456789") == ""
}
