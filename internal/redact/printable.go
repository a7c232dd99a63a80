package redact

import (
	"unicode"
	"unicode/utf8"
)

// Printable reports whether s is valid UTF-8 of printable characters,
// spaces included and control characters not: a name a ledger or a log
// shows as it is.
func Printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
