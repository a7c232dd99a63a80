package config

import (
	"strings"
	"testing"
)

// A problem never quotes a password, wherever the URL holding it is and
// whatever is wrong with it.
func TestProblemsHideSecrets(t *testing.T) {
	const pass = "Pw-90be7c"
	tests := []struct {
		name, yaml string
		want       []string // in the problems
	}{
		{"handler URL that does not parse", `
handler: {url: "http://app:` + pass + `/x@127.0.0.1:8080/events"}
sources: [{name: a, rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: a}}]
`, []string{"handler.url: not a URL", "app:xxxxx@127.0.0.1:8080/events", "percent-encoded"}},
		{"handler URL with a space in the password", `
handler: {url: "http://app:my ` + pass + `@127.0.0.1:8080/events"}
sources: [{name: a, rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: a}}]
`, []string{"handler.url: not a URL", "app:xxxxx@"}},
		{"handler URL without a host", `
handler: {url: "http://app:` + pass + `@/events"}
sources: [{name: a, rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: a}}]
`, []string{"handler.url: no host", "app:xxxxx@"}},
		{"rabbitmq URL that does not parse", `
handler: {url: "http://127.0.0.1:8080/events"}
sources: [{name: a, rabbitmq: {url: "amqp://guest:` + pass + `#1@127.0.0.1:5672/", queue: a}}]
`, []string{"sources[0].rabbitmq.url: not a URL", "guest:xxxxx@"}},
		{"rabbitmq URL with a bad escape", `
handler: {url: "http://127.0.0.1:8080/events"}
sources: [{name: a, rabbitmq: {url: "amqp://guest:` + pass + `%zz@127.0.0.1:5672/", queue: a}}]
`, []string{"sources[0].rabbitmq.url: not a URL", "guest:xxxxx@"}},
		{"kafka broker with a password", `
handler: {url: "http://127.0.0.1:8080/events"}
sources: [{name: a, kafka: {brokers: ["app:` + pass + `@127.0.0.1:9092"], topic: t, group: g}}]
`, []string{"sources[0].kafka.brokers[0]: want host:port", "app:xxxxx@"}},
		{"kafka broker with a password and no port", `
handler: {url: "http://127.0.0.1:8080/events"}
sources: [{name: a, kafka: {brokers: ["app:` + pass + `@broker"], topic: t, group: g}}]
`, []string{"sources[0].kafka.brokers[0]: want host:port"}},
		{"a URL where a number belongs", `
handler: {url: "http://127.0.0.1:8080/events", max_concurrency: "http://app:` + pass + `@h/"}
sources: [{name: a, rabbitmq: {url: "amqp://guest:guest@127.0.0.1:5672/", queue: a}}]
`, []string{"handler.max_concurrency", "app:xxxxx@"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil {
				t.Fatal("the config was accepted")
			}
			msg := err.Error()
			if strings.Contains(msg, pass) || strings.Contains(msg, "90be7c") {
				t.Errorf("the problems quote the password:\n%s", msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("the problems lack %q:\n%s", w, msg)
				}
			}
		})
	}
}
