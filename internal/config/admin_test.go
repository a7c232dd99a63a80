package config

import (
	"strings"
	"testing"
)

func TestAdmin(t *testing.T) {
	tests := []struct {
		name    string
		admin   string
		problem string // "" for none
		enabled bool
	}{
		{"off by default", "{listen: 127.0.0.1:9400}", "", false},
		{"token file", "{listen: 127.0.0.1:9400, token_file: /etc/handoff/token}", "", true},
		{"anonymous read on loopback", "{listen: 127.0.0.1:9400, allow_anonymous_read: true}", "", true},
		{"anonymous read on localhost", "{listen: 'localhost:9400', allow_anonymous_read: true}", "", true},
		{"anonymous read on IPv6 loopback", "{listen: '[::1]:9400', allow_anonymous_read: true}", "", true},
		{"anonymous read on every interface", "{listen: ':9400', allow_anonymous_read: true}", "admin.allow_anonymous_read: only on a loopback listener", true},
		{"anonymous read on another address", "{listen: '10.0.0.5:9400', allow_anonymous_read: true, token_file: /t}", "admin.allow_anonymous_read: only on a loopback listener", true},
		{"bad listen", "{listen: nowhere}", "admin.listen: want host:port", false},
		{"a token name", "{listen: 127.0.0.1:9400, token_file: /t, token_name: ops-oncall}", "", true},
		{"an empty token name", "{listen: 127.0.0.1:9400, token_name: ''}", "admin.token_name: want 1 to 64 bytes", false},
		{"a token name too long", "{listen: 127.0.0.1:9400, token_name: " + strings.Repeat("n", 65) + "}", "admin.token_name: want 1 to 64 bytes", false},
		{"a token name with a newline", `{listen: 127.0.0.1:9400, token_name: "a\nb"}`, "admin.token_name: want 1 to 64 bytes", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(strings.Replace(validYAML, "admin:     {listen: 127.0.0.1:9400}", "admin: "+tt.admin, 1)))
			switch {
			case tt.problem == "" && err != nil:
				t.Fatalf("Parse: %v", err)
			case tt.problem != "" && (err == nil || !strings.Contains(err.Error(), tt.problem)):
				t.Fatalf("Parse: %v, want %q", err, tt.problem)
			case tt.problem != "":
				return
			}
			if want := "admin"; tt.name == "a token name" && cfg.Admin.TokenName != "ops-oncall" || tt.name != "a token name" && cfg.Admin.TokenName != want {
				t.Errorf("admin.token_name = %q", cfg.Admin.TokenName)
			}
			if cfg.Admin.Enabled() != tt.enabled {
				t.Errorf("Enabled = %v, want %v", cfg.Admin.Enabled(), tt.enabled)
			}
			// An admin API that is off is a notice, not a problem.
			off := strings.Contains(strings.Join(cfg.Notices(), "\n"), "admin API off")
			if off == tt.enabled {
				t.Errorf("notices %q with the API enabled = %v", cfg.Notices(), tt.enabled)
			}
		})
	}
}
