package handler

import (
	"net/http"
	"testing"
	"time"

	"handoff.dev/handoff/internal/budget"
)

// now0 is the fixed "now" of every clock-dependent classifier test.
var now0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func mustClassifier(t testing.TB, overrides map[string]string) *Classifier {
	t.Helper()
	c, err := NewClassifier(overrides)
	if err != nil {
		t.Fatalf("NewClassifier(%v): %v", overrides, err)
	}
	return c
}

func TestClassifierDefaultStatus(t *testing.T) {
	tests := []struct {
		name string
		code int
		want budget.Outcome
	}{
		{"100 continue is not final", 100, budget.Retry},
		{"102 processing is not final", 102, budget.Retry},
		{"200 ok", 200, budget.Success},
		{"201 created", 201, budget.Success},
		{"202 accepted", 202, budget.Success},
		{"204 no content", 204, budget.Success},
		{"299 unassigned 2xx", 299, budget.Success},
		{"300 multiple choices", 300, budget.Permanent},
		{"301 moved permanently", 301, budget.Permanent},
		{"302 found", 302, budget.Permanent},
		{"307 temporary redirect", 307, budget.Permanent},
		{"308 permanent redirect", 308, budget.Permanent},
		{"400 bad request", 400, budget.Permanent},
		{"401 unauthorized", 401, budget.Permanent},
		{"403 forbidden", 403, budget.Permanent},
		{"404 not found", 404, budget.Permanent},
		{"405 method not allowed", 405, budget.Permanent},
		{"408 request timeout", 408, budget.Permanent},
		{"409 conflict defers", 409, budget.Defer},
		{"410 gone drops", 410, budget.Drop},
		{"413 content too large", 413, budget.Permanent},
		{"415 unsupported media type", 415, budget.Permanent},
		{"422 unprocessable", 422, budget.Permanent},
		{"428 precondition required", 428, budget.Permanent},
		{"429 too many requests", 429, budget.Overload},
		{"451 unavailable for legal reasons", 451, budget.Permanent},
		{"499 unassigned 4xx", 499, budget.Permanent},
		{"500 internal server error", 500, budget.Retry},
		{"501 not implemented", 501, budget.Retry},
		{"502 bad gateway", 502, budget.Retry},
		{"503 service unavailable", 503, budget.Overload},
		{"504 gateway timeout", 504, budget.Retry},
		{"599 unassigned 5xx", 599, budget.Retry},
		{"0 no status", 0, budget.Permanent},
		{"99 below range", 99, budget.Permanent},
		{"600 above range", 600, budget.Permanent},
		{"999 far above range", 999, budget.Permanent},
		{"negative", -503, budget.Permanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, overrides := range []map[string]string{nil, {}} {
				c := mustClassifier(t, overrides)
				if got := c.Status(tt.code); got != tt.want {
					t.Errorf("Status(%d) with overrides %#v = %v, want %v", tt.code, overrides, got, tt.want)
				}
			}
		})
	}
}

func TestNewClassifierOverrides(t *testing.T) {
	type check struct {
		code int
		want budget.Outcome
	}
	tests := []struct {
		name      string
		overrides map[string]string
		checks    []check
	}{
		{
			name:      "exact status",
			overrides: map[string]string{"404": "retry"},
			checks: []check{
				{404, budget.Retry},
				{400, budget.Permanent}, // the rest of its class is untouched
				{409, budget.Defer},
				{500, budget.Retry},
			},
		},
		{
			name:      "exact status replaces a default exact entry",
			overrides: map[string]string{"409": "permanent", "410": "success"},
			checks:    []check{{409, budget.Permanent}, {410, budget.Success}, {429, budget.Overload}},
		},
		{
			name:      "dead-letter is the spelling of permanent",
			overrides: map[string]string{"500": "dead-letter"},
			checks:    []check{{500, budget.Permanent}, {502, budget.Retry}},
		},
		{
			name:      "class",
			overrides: map[string]string{"5xx": "permanent"},
			checks:    []check{{500, budget.Permanent}, {502, budget.Permanent}, {599, budget.Permanent}, {404, budget.Permanent}, {200, budget.Success}},
		},
		{
			name:      "class override covers the default exact entry in its class",
			overrides: map[string]string{"5xx": "permanent"},
			checks:    []check{{503, budget.Permanent}},
		},
		{
			name:      "class override covers every default exact entry in its class",
			overrides: map[string]string{"4xx": "retry"},
			checks:    []check{{400, budget.Retry}, {409, budget.Retry}, {410, budget.Retry}, {429, budget.Retry}, {503, budget.Overload}},
		},
		{
			name:      "class override leaves default exact entries of other classes",
			overrides: map[string]string{"4xx": "retry"},
			checks:    []check{{503, budget.Overload}, {500, budget.Retry}},
		},
		{
			name:      "exact override wins over class override",
			overrides: map[string]string{"5xx": "permanent", "503": "overload", "500": "unknown"},
			checks:    []check{{503, budget.Overload}, {500, budget.Unknown}, {502, budget.Permanent}},
		},
		{
			name:      "exact override wins over class override in the same class as a default",
			overrides: map[string]string{"4xx": "success", "409": "drop"},
			checks:    []check{{409, budget.Drop}, {410, budget.Success}, {429, budget.Success}, {400, budget.Success}},
		},
		{
			name:      "3xx class",
			overrides: map[string]string{"3xx": "success"},
			checks:    []check{{301, budget.Success}, {304, budget.Success}},
		},
		{
			name:      "1xx class",
			overrides: map[string]string{"1xx": "unknown"},
			checks:    []check{{100, budget.Unknown}},
		},
		{
			name:      "2xx class with an exact exception",
			overrides: map[string]string{"2xx": "retry", "204": "success"},
			checks:    []check{{200, budget.Retry}, {202, budget.Retry}, {204, budget.Success}},
		},
		{
			name:      "status outside any class may be mapped exactly",
			overrides: map[string]string{"599": "drop", "100": "permanent"},
			checks:    []check{{599, budget.Drop}, {100, budget.Permanent}, {598, budget.Retry}},
		},
		{
			name:      "every outcome name",
			overrides: map[string]string{"201": "success", "202": "retry", "203": "overload", "204": "unknown", "205": "defer", "206": "permanent", "207": "drop"},
			checks: []check{
				{201, budget.Success}, {202, budget.Retry}, {203, budget.Overload}, {204, budget.Unknown},
				{205, budget.Defer}, {206, budget.Permanent}, {207, budget.Drop},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustClassifier(t, tt.overrides)
			for _, ck := range tt.checks {
				if got := c.Status(ck.code); got != ck.want {
					t.Errorf("Status(%d) = %v, want %v", ck.code, got, ck.want)
				}
			}
		})
	}
}

// TestNewClassifierOverridesIgnoreMapOrder builds each classifier many times:
// map iteration order is random, and an exact entry must win over its class
// whichever key NewClassifier happens to read first.
func TestNewClassifierOverridesIgnoreMapOrder(t *testing.T) {
	tests := []struct {
		name      string
		overrides map[string]string
		code      int
		want      budget.Outcome
	}{
		{"exact 503 and 5xx", map[string]string{"5xx": "permanent", "503": "retry"}, 503, budget.Retry},
		{"exact 404 and 4xx", map[string]string{"404": "retry", "4xx": "success"}, 404, budget.Retry},
		{"exact 429 and 4xx", map[string]string{"4xx": "defer", "429": "overload"}, 429, budget.Overload},
		{"class alone removes 410", map[string]string{"4xx": "retry", "500": "drop"}, 410, budget.Retry},
		// A key accepted as an exact status must act as one: either it is
		// rejected, or it wins over its class like "503" does.
		{"zero-padded exact status and its class", map[string]string{"5xx": "permanent", "0503": "retry"}, 503, budget.Retry},
		{"signed exact status and its class", map[string]string{"4xx": "success", "+404": "retry"}, 404, budget.Retry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range 64 {
				c, err := NewClassifier(tt.overrides)
				if err != nil {
					continue // rejecting a non-canonical key is also correct
				}
				if got := c.Status(tt.code); got != tt.want {
					t.Fatalf("build %d: Status(%d) = %v, want %v", i, tt.code, got, tt.want)
				}
			}
		})
	}
}

func TestNewClassifierInvalid(t *testing.T) {
	tests := []struct {
		name      string
		overrides map[string]string
	}{
		{"unknown outcome", map[string]string{"404": "bogus"}},
		{"empty outcome", map[string]string{"404": ""}},
		{"unreachable cannot be configured", map[string]string{"500": "unreachable"}},
		{"unknown outcome on a class", map[string]string{"5xx": "later"}},
		{"outcome with spaces", map[string]string{"404": "dead letter"}},
		{"word as status", map[string]string{"notfound": "retry"}},
		{"empty key", map[string]string{"": "retry"}},
		{"status below range", map[string]string{"99": "retry"}},
		{"status zero", map[string]string{"0": "retry"}},
		{"status above range", map[string]string{"600": "retry"}},
		{"four-digit status", map[string]string{"1000": "retry"}},
		{"negative status", map[string]string{"-404": "retry"}},
		{"class 0xx", map[string]string{"0xx": "retry"}},
		{"class 6xx", map[string]string{"6xx": "retry"}},
		{"class 9xx", map[string]string{"9xx": "retry"}},
		{"short class", map[string]string{"5x": "retry"}},
		{"long class", map[string]string{"5xxx": "retry"}},
		{"class suffix only", map[string]string{"xx": "retry"}},
		{"partial class", map[string]string{"50x": "retry"}},
		{"space inside status", map[string]string{"40 4": "retry"}},
		{"one bad key among good ones", map[string]string{"404": "retry", "5xx": "permanent", "oops": "drop"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClassifier(tt.overrides)
			if err == nil {
				t.Fatalf("NewClassifier(%q) = %v, nil; want an error", tt.overrides, c)
			}
			if c != nil {
				t.Errorf("NewClassifier(%q) returned a classifier with its error", tt.overrides)
			}
		})
	}
}

func TestClassifierResponse(t *testing.T) {
	tests := []struct {
		name      string
		overrides map[string]string
		code      int
		header    map[string]string
		want      budget.Outcome
		wantAfter time.Duration
	}{
		{name: "status alone", code: 500, want: budget.Retry},
		{name: "declared success wins over 500", code: 500, header: map[string]string{"Handoff-Outcome": "success"}, want: budget.Success},
		{name: "declared retry wins over 200", code: 200, header: map[string]string{"Handoff-Outcome": "retry"}, want: budget.Retry},
		{name: "declared defer wins over 400", code: 400, header: map[string]string{"Handoff-Outcome": "defer"}, want: budget.Defer},
		{name: "declared dead-letter wins over 503", code: 503, header: map[string]string{"Handoff-Outcome": "dead-letter"}, want: budget.Permanent},
		{name: "declared drop wins over 500", code: 500, header: map[string]string{"Handoff-Outcome": "drop"}, want: budget.Drop},
		{name: "declared outcome is case-insensitive", code: 200, header: map[string]string{"Handoff-Outcome": "DeFeR"}, want: budget.Defer},
		{name: "declared dead-letter upper case", code: 200, header: map[string]string{"Handoff-Outcome": "DEAD-LETTER"}, want: budget.Permanent},
		{name: "declared outcome is trimmed", code: 500, header: map[string]string{"Handoff-Outcome": " \tdrop  "}, want: budget.Drop},
		{name: "unknown declared outcome is ignored", code: 200, header: map[string]string{"Handoff-Outcome": "maybe"}, want: budget.Success},
		{name: "unknown declared outcome keeps 409", code: 409, header: map[string]string{"Handoff-Outcome": "later"}, want: budget.Defer},
		{name: "unreachable cannot be declared", code: 503, header: map[string]string{"Handoff-Outcome": "unreachable"}, want: budget.Overload},
		{name: "unreachable cannot be declared in any case", code: 200, header: map[string]string{"Handoff-Outcome": " Unreachable "}, want: budget.Success},
		{name: "blank declared outcome is ignored", code: 410, header: map[string]string{"Handoff-Outcome": "   "}, want: budget.Drop},
		{name: "declared outcome wins over an operator override", overrides: map[string]string{"404": "retry"}, code: 404, header: map[string]string{"Handoff-Outcome": "success"}, want: budget.Success},
		{name: "operator override without a declared outcome", overrides: map[string]string{"404": "retry"}, code: 404, want: budget.Retry},
		{name: "retry-after seconds on 429", code: 429, header: map[string]string{"Retry-After": "30"}, want: budget.Overload, wantAfter: 30 * time.Second},
		{name: "retry-after date on 503", code: 503, header: map[string]string{"Retry-After": now0.Add(90 * time.Second).Format(http.TimeFormat)}, want: budget.Overload, wantAfter: 90 * time.Second},
		{name: "retry-after read with a declared retry", code: 200, header: map[string]string{"Handoff-Outcome": "retry", "Retry-After": "5"}, want: budget.Retry, wantAfter: 5 * time.Second},
		{name: "retry-after garbage is zero", code: 503, header: map[string]string{"Retry-After": "soon"}, want: budget.Overload},
		{name: "retry-after in the past is zero", code: 429, header: map[string]string{"Retry-After": now0.Add(-time.Minute).Format(http.TimeFormat)}, want: budget.Overload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustClassifier(t, tt.overrides)
			h := http.Header{}
			for k, v := range tt.header {
				h.Set(k, v)
			}
			got, after := c.Response(tt.code, h, now0)
			if got != tt.want {
				t.Errorf("outcome = %v, want %v", got, tt.want)
			}
			if after != tt.wantAfter {
				t.Errorf("retry-after = %v, want %v", after, tt.wantAfter)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	tests := []struct {
		name string
		v    string
		want time.Duration
	}{
		{"zero seconds", "0", 0},
		{"one second", "1", time.Second},
		{"two minutes", "120", 2 * time.Minute},
		{"surrounding whitespace", " 30 \t", 30 * time.Second},
		{"leading zeros", "007", 7 * time.Second},
		{"exactly the cap", "86400", 24 * time.Hour},
		{"just past the cap", "86401", 24 * time.Hour},
		{"years of seconds", "100000000", 24 * time.Hour},
		{"max int64 seconds", "9223372036854775807", 24 * time.Hour},
		{"seconds beyond int64", "99999999999999999999", 24 * time.Hour},
		{"negative one", "-1", 0},
		{"negative day", "-86400", 0},
		{"negative beyond int64", "-99999999999999999999", 0},
		{"empty", "", 0},
		{"blank", "   ", 0},
		{"word", "soon", 0},
		{"fraction", "1.5", 0},
		{"number with a unit", "12s", 0},
		{"duration syntax", "1m30s", 0},
		{"IMF-fixdate ahead", now0.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{"IMF-fixdate an hour ahead", now0.Add(time.Hour).Format(http.TimeFormat), time.Hour},
		{"IMF-fixdate with whitespace", "  " + now0.Add(10*time.Second).Format(http.TimeFormat) + " ", 10 * time.Second},
		{"RFC 850 date ahead", now0.Add(90 * time.Second).Format("Monday, 02-Jan-06 15:04:05 GMT"), 90 * time.Second},
		{"asctime date ahead", now0.Add(90 * time.Second).Format(time.ANSIC), 90 * time.Second},
		{"date exactly now", now0.Format(http.TimeFormat), 0},
		{"date a second ago", now0.Add(-time.Second).Format(http.TimeFormat), 0},
		{"date long ago", "Sun, 06 Nov 1994 08:49:37 GMT", 0},
		{"date beyond the cap", now0.Add(48 * time.Hour).Format(http.TimeFormat), 24 * time.Hour},
		{"date far in the future", "Fri, 31 Dec 9999 23:59:59 GMT", 24 * time.Hour},
		{"date in a non-HTTP layout", now0.Add(time.Hour).Format(time.RFC3339), 0},
		{"mangled date", "Sun, 32 Jun 2025 12:00:00 GMT", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParseRetryAfter(tt.v, now0); got != tt.want {
				t.Errorf("ParseRetryAfter(%q) = %v, want %v", tt.v, got, tt.want)
			}
		})
	}
}
