package broker_test

import (
	"testing"
	"time"

	"handoff.dev/handoff/internal/broker"
)

func TestIsOwned(t *testing.T) {
	tests := []struct {
		name   string
		header string
		want   bool
	}{
		{name: "lower case", header: "handoff-attempt", want: true},
		{name: "title case", header: "Handoff-Attempt", want: true},
		{name: "upper case", header: "HANDOFF-X", want: true},
		{name: "prefix only", header: "handoff-", want: true},
		{name: "every trail header", header: broker.HeaderReplayID, want: true},
		{name: "prefix without dash", header: "handoff", want: false},
		{name: "prefix inside", header: "x-handoff-a", want: false},
		{name: "empty", header: "", want: false},
		{name: "underscore instead of dash", header: "handoff_attempt", want: false},
		{name: "broker header", header: "x-death", want: false},
		{name: "multi-byte rune of same length", header: "handoff\u00e9", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := broker.IsOwned(tt.header); got != tt.want {
				t.Errorf("IsOwned(%q) = %v, want %v", tt.header, got, tt.want)
			}
		})
	}
}

func TestTierName(t *testing.T) {
	tests := []struct {
		name string
		d    time.Duration
		want string
	}{
		{name: "one second", d: time.Second, want: "1s"},
		{name: "ten seconds", d: 10 * time.Second, want: "10s"},
		{name: "one minute, not 1m0s", d: time.Minute, want: "1m"},
		{name: "ninety seconds", d: 90 * time.Second, want: "1m30s"},
		{name: "one hour, not 1h0m0s", d: time.Hour, want: "1h"},
		{name: "hour and a half", d: 90 * time.Minute, want: "1h30m"},
		{name: "hour and a second skips minutes", d: time.Hour + time.Second, want: "1h1s"},
		{name: "a day in hours", d: 24 * time.Hour, want: "24h"},
		{name: "sub-second", d: 250 * time.Millisecond, want: "250ms"},
		{name: "not whole seconds stays in ms", d: 1500 * time.Millisecond, want: "1500ms"},
		{name: "zero", d: 0, want: "0s"},
		{name: "negative", d: -time.Second, want: "0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := broker.TierName(tt.d); got != tt.want {
				t.Errorf("TierName(%v) = %q, want %q", tt.d, got, tt.want)
			}
		})
	}
}

func TestDestinationString(t *testing.T) {
	tests := []struct {
		name string
		dest broker.Destination
		want string
	}{
		{name: "dead letter", dest: broker.Destination{DeadLetter: true}, want: "dlq"},
		{name: "dead letter ignores tier", dest: broker.Destination{DeadLetter: true, Tier: 10 * time.Second}, want: "dlq"},
		{name: "ten second tier", dest: broker.Destination{Tier: 10 * time.Second}, want: "retry.10s"},
		{name: "hour and a half tier", dest: broker.Destination{Tier: 90 * time.Minute}, want: "retry.1h30m"},
		{name: "sub-second tier", dest: broker.Destination{Tier: 250 * time.Millisecond}, want: "retry.250ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.dest.String(); got != tt.want {
				t.Errorf("%+v.String() = %q, want %q", tt.dest, got, tt.want)
			}
		})
	}
}
