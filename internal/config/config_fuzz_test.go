package config

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse: any input either parses into a config that validates, or is
// refused with problems that each say something; it never panics.
func FuzzParse(f *testing.F) {
	f.Add([]byte(validYAML))
	f.Add([]byte("handler: {url: http://x}\nsources: [{name: a, rabbitmq: {url: amqp://x/, queue: q}}]"))
	f.Add([]byte("a: &x {b: *x}"))
	f.Add([]byte("retry: {tiers: [1s, !!binary aGk=]}"))
	f.Add([]byte("sources: [{name: a, rabbitmq: ~, kafka: ~}]"))
	f.Add([]byte("outcomes: {http: {5xx: drop, '200': [x]}}"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("journal: {max_size: 1GiB}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err == nil {
			if verr := cfg.Validate(); verr != nil {
				t.Fatalf("Parse accepted a config that does not validate: %v", verr)
			}
			return
		}
		var ps Problems
		if !errors.As(err, &ps) {
			t.Fatalf("Parse returned %T, want Problems: %v", err, err)
		}
		if len(ps) == 0 {
			t.Fatal("empty Problems returned as an error")
		}
		for _, p := range ps {
			if strings.TrimSpace(p.Message) == "" {
				t.Fatalf("problem without a message at %q", p.Path)
			}
		}
	})
}
