package redact

import "testing"

func TestPrintable(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"admin", true},
		{"admin/alice smith", true},
		{"Zoë", true},
		{"", true},
		{"line\nbreak", false},
		{"tab\there", false},
		{"bell\a", false},
		{"\xff\xfe", false},
	} {
		if got := Printable(tc.s); got != tc.want {
			t.Errorf("Printable(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}
