package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want ByteSize
		err  string
	}{
		{name: "mebibytes", in: "256MiB", want: 256 << 20},
		{name: "gibibytes", in: "1GiB", want: 1 << 30},
		{name: "kubernetes style", in: "512Mi", want: 512 << 20},
		{name: "megabytes", in: "500MB", want: 500e6},
		{name: "a space before the unit", in: "2 GiB", want: 2 << 30},
		{name: "bare bytes", in: "1048576", want: 1 << 20},
		{name: "bytes", in: "4096B", want: 4096},
		{name: "a bare M", in: "256M", err: "invalid size \"256M\""},
		{name: "lower case", in: "256mib", err: "invalid size"},
		{name: "a fraction", in: "1.5GiB", err: "invalid size"},
		{name: "negative", in: "-1GiB", err: "invalid size"},
		{name: "no number", in: "GiB", err: "invalid size"},
		{name: "empty", in: "", err: "invalid size"},
		{name: "too large", in: "9000000TiB", err: "too large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseByteSize(tt.in)
			switch {
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("ParseByteSize(%q) = %v, %v; want an error containing %q", tt.in, got, err, tt.err)
			case tt.err == "" && (err != nil || got != tt.want):
				t.Fatalf("ParseByteSize(%q) = %v, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestByteSizeString(t *testing.T) {
	for _, tt := range []struct {
		in   ByteSize
		want string
	}{{256 << 20, "256MiB"}, {1 << 30, "1GiB"}, {1536 << 10, "1536KiB"}, {500e6, "500000000B"}, {0, "0B"}} {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("ByteSize(%d).String() = %q, want %q", int64(tt.in), got, tt.want)
		}
		if back, err := ParseByteSize(tt.in.String()); err != nil || back != tt.in {
			t.Errorf("ParseByteSize(%q) = %v, %v; want %d back", tt.in.String(), back, err, int64(tt.in))
		}
	}
}

func TestJournalMaxSize(t *testing.T) {
	tests := []struct {
		name    string
		journal string
		want    ByteSize
		problem string // the problem line's start, "" when it parses
	}{
		{name: "default", journal: "{path: ./handoff.db}", want: 256 << 20},
		{name: "with a unit", journal: "{path: ./handoff.db, max_size: 1GiB}", want: 1 << 30},
		{name: "bare bytes", journal: "{path: ./handoff.db, max_size: 67108864}", want: 64 << 20},
		{name: "the least", journal: "{path: ./handoff.db, max_size: 1MiB}", want: 1 << 20},
		{name: "below the least", journal: "{path: ./handoff.db, max_size: 512KiB}", problem: "journal.max_size: want at least 1MiB, got 512KiB"},
		{name: "zero", journal: "{path: ./handoff.db, max_size: 0}", problem: "journal.max_size: want at least 1MiB, got 0B"},
		{name: "no unit known", journal: "{path: ./handoff.db, max_size: 2G}", problem: "journal.max_size: invalid size \"2G\""},
		{name: "a fraction", journal: "{path: ./handoff.db, max_size: 0.5GiB}", problem: "journal.max_size: invalid size"},
		{name: "negative", journal: "{path: ./handoff.db, max_size: -1}", problem: "journal.max_size: invalid size"},
		{name: "a list", journal: "{path: ./handoff.db, max_size: [1GiB]}", problem: "journal.max_size: want a single value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(replace(t, "journal:   {path: ./handoff.db}", "journal: "+tt.journal)))
			if tt.problem == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if cfg.Journal.MaxSize != tt.want {
					t.Errorf("journal.max_size = %v, want %v", cfg.Journal.MaxSize, tt.want)
				}
				return
			}
			wantProblem(t, err, tt.problem)
		})
	}
}

func TestJournalLinger(t *testing.T) {
	tests := []struct {
		name    string
		journal string
		want    time.Duration
		problem string // the problem line's start, "" when it parses
	}{
		{name: "default", journal: "{path: ./handoff.db}", want: 2 * time.Millisecond},
		{name: "off", journal: "{path: ./handoff.db, linger: 0s}", want: 0},
		{name: "the most", journal: "{path: ./handoff.db, linger: 10ms}", want: 10 * time.Millisecond},
		{name: "too long", journal: "{path: ./handoff.db, linger: 20ms}", problem: "journal.linger: must be between 0 and 10ms"},
		{name: "negative", journal: "{path: ./handoff.db, linger: -1ms}", problem: "journal.linger: must be between 0 and 10ms"},
		{name: "no unit", journal: "{path: ./handoff.db, linger: 5}", problem: "journal.linger: invalid duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(replace(t, "journal:   {path: ./handoff.db}", "journal: "+tt.journal)))
			if tt.problem == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if cfg.Journal.Linger.D() != tt.want {
					t.Errorf("journal.linger = %v, want %v", cfg.Journal.Linger.D(), tt.want)
				}
				return
			}
			wantProblem(t, err, tt.problem)
		})
	}
}

// wantProblem fails unless err is Problems with one that starts with prefix.
func wantProblem(t *testing.T, err error, prefix string) {
	t.Helper()
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("Parse = %v, want Problems", err)
	}
	for _, p := range ps {
		if strings.HasPrefix(p.String(), prefix) {
			return
		}
	}
	t.Errorf("problems %q, want one starting %q", ps.Error(), prefix)
}

func TestHandlerMaxMessageBytes(t *testing.T) {
	tests := []struct {
		name, value string
		want        ByteSize
		problem     string // the problem line's start, "" when it parses
	}{
		{name: "default", want: 16 << 20},
		{name: "with a unit", value: "1MiB", want: 1 << 20},
		{name: "the most", value: "512MiB", want: 512 << 20},
		{name: "above the most", value: "513MiB", problem: "handler.max_message_bytes: want a size from 1B to 512MiB, got 513MiB"},
		{name: "zero", value: "0", problem: "handler.max_message_bytes: want a size from 1B to 512MiB, got 0B"},
		{name: "no unit known", value: "2G", problem: "handler.max_message_bytes: invalid size \"2G\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yaml := validYAML
			if tt.value != "" {
				yaml = replace(t, "  max_concurrency: 64\n", "  max_concurrency: 64\n  max_message_bytes: "+tt.value+"\n")
			}
			cfg, err := Parse([]byte(yaml))
			if tt.problem != "" {
				wantProblem(t, err, tt.problem)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Handler.MaxMessageBytes != tt.want {
				t.Errorf("max_message_bytes = %v, want %v", cfg.Handler.MaxMessageBytes, tt.want)
			}
		})
	}
}
