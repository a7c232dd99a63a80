package redact

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
)

// Text returns s with every URL in it redacted as [URL] does: each
// whitespace-separated word that looks like a URL with a userinfo or query,
// and each quoted string (as %q or a backquote writes it) that holds one,
// which is re-quoted. Text without '@' or "://" comes back unchanged.
func Text(s string) string {
	if !strings.Contains(s, "@") && !strings.Contains(s, "://") {
		return s
	}
	var b strings.Builder
	changed := false
	for i := 0; i < len(s); {
		if c := s[i]; c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			b.WriteByte(c)
			i++
			continue
		}
		// A word runs to the next whitespace; a quoted string inside it is
		// redacted on its own, so that a password holding an escaped quote
		// does not end it early.
		j := i
		for j < len(s) && s[j] != ' ' && s[j] != '\t' && s[j] != '\n' && s[j] != '\r' {
			if s[j] == '"' || s[j] == '`' {
				if _, err := strconv.QuotedPrefix(s[j:]); err == nil {
					break
				}
			}
			j++
		}
		if j > i {
			word := s[i:j]
			if r, ok := maskWord(word); ok {
				word, changed = r, true
			}
			b.WriteString(word)
			i = j
			continue
		}
		// s[i] opens a quoted string.
		q, _ := strconv.QuotedPrefix(s[i:])
		i += len(q)
		if u, err := strconv.Unquote(q); err == nil {
			// A quoted URL (as *url.Error quotes it) is one URL even with a
			// space in its password; anything else is a message of its own.
			r := u
			if authorityStart(u) > 0 {
				r, _ = mask(u)
			} else {
				r = Text(u)
			}
			if r != u {
				q, changed = strconv.Quote(r), true
			}
		}
		b.WriteString(q)
	}
	if !changed {
		return s
	}
	return b.String()
}

// maskWord redacts word when it looks like a URL: it holds "://", or a ':'
// before an '@' (user:password@host without a scheme).
func maskWord(word string) (string, bool) {
	at := strings.LastIndexByte(word, '@')
	if !strings.Contains(word, "://") && (at < 0 || !strings.Contains(word[:at], ":")) {
		return word, false
	}
	return mask(word)
}

// Error returns err unchanged when its message holds no secret, else an
// error whose message is redacted by [Text] and which unwraps to err, so
// errors.Is and errors.As see what they saw before.
//
// A *url.Error from parsing is stricter: net/url cuts a URL at its first
// '#' before it reports it, so a password holding a '#' is reported as an
// "invalid port" with no '@' to show it is a password. Such an error shows
// the URL with the port masked too, and without net/url's reason, which
// quotes the piece it could not read.
func Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	red := Text(msg)
	var ue *url.Error
	if errors.As(err, &ue) && ue.Op == "parse" {
		u, masked := mask(ue.URL)
		if !masked {
			u, masked = maskPort(ue.URL)
		}
		if masked {
			red = Text(strings.Replace(msg, ue.Error(),
				ue.Op+" "+strconv.Quote(u)+": not a valid URL (the reason is withheld: it may quote a password)", 1))
		}
	}
	if red == msg {
		return err
	}
	return &redacted{err: err, msg: red}
}

// maskPort masks what follows the first ':' of s's authority, and reports
// whether there was one.
func maskPort(s string) (string, bool) {
	start := authorityStart(s)
	end := len(s)
	if i := strings.IndexAny(s[start:], "/?#"); i >= 0 {
		end = start + i
	}
	colon := strings.IndexByte(s[start:end], ':')
	if colon < 0 {
		return s, false
	}
	return s[:start+colon+1] + Mask + s[end:], true
}

// redacted is an error printed without its secrets.
type redacted struct {
	err error
	msg string
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }
