package redact

import (
	"net/url"
	"strings"
)

// Mask replaces every secret.
const Mask = "xxxxx"

// secretNames are the parts of a query parameter's name, in lower case, that
// make its value a secret: password, passwd, pass, pwd, secret, token,
// access_token, key, apikey, api_key, sasl_*, auth, credentials, signature.
var secretNames = []string{"pass", "pwd", "secret", "token", "key", "sasl", "auth", "credential", "signature"}

// URL returns s with the password of its userinfo and the values of its
// secret-named query (and fragment) parameters masked. s need not parse as a
// URL: the same rules apply to its text, so a URL that net/url refuses is
// never shown with its password. A string without '@' or secret parameters
// comes back unchanged.
func URL(s string) string {
	out, _ := mask(s)
	return out
}

// mask is URL, also reporting whether anything was masked.
func mask(s string) (string, bool) {
	if !strings.ContainsAny(s, "@?#") {
		return s, false
	}
	var b strings.Builder
	b.Grow(len(s))
	masked := false
	rest := authorityStart(s)
	// The userinfo ends at the last '@': a password may hold an unescaped
	// '@', '/', '?' or '#' that makes net/url read the URL differently (or
	// not at all), and the password is what the user meant, not what
	// net/url found.
	if at := strings.LastIndexByte(s, '@'); at >= rest {
		if colon := strings.IndexByte(s[rest:at], ':'); colon >= 0 {
			b.WriteString(s[:rest+colon+1])
			b.WriteString(Mask)
			masked = true
		} else {
			b.WriteString(s[:at])
		}
		rest = at
	} else {
		b.WriteString(s[:rest])
	}
	// Query and fragment: name=value pairs after the first '?' or '#'.
	tail := s[rest:]
	if q := strings.IndexAny(tail, "?#"); q >= 0 {
		b.WriteString(tail[:q+1])
		if maskParams(&b, tail[q+1:]) {
			masked = true
		}
	} else {
		b.WriteString(tail)
	}
	if !masked {
		return s, false
	}
	return b.String(), true
}

// authorityStart is where the authority (userinfo, host) begins: after
// "scheme://", or at 0 when s has no scheme before a "://".
func authorityStart(s string) int {
	i := strings.Index(s, "://")
	if i <= 0 || !isScheme(s[:i]) {
		return 0
	}
	return i + 3
}

func isScheme(s string) bool {
	for i, c := range []byte(s) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return true
}

// maskParams writes params (a query, perhaps followed by '#' and a
// fragment) to b with each secret-named value masked, and reports whether it
// masked one.
func maskParams(b *strings.Builder, params string) bool {
	masked := false
	for {
		end := strings.IndexAny(params, "&;?#")
		pair := params
		if end >= 0 {
			pair = params[:end]
		}
		name, _, hasValue := strings.Cut(pair, "=")
		if hasValue && isSecretName(name) {
			b.WriteString(name)
			b.WriteString("=")
			b.WriteString(Mask)
			masked = true
		} else {
			b.WriteString(pair)
		}
		if end < 0 {
			return masked
		}
		b.WriteByte(params[end])
		params = params[end+1:]
	}
}

func isSecretName(name string) bool {
	if n, err := url.QueryUnescape(name); err == nil {
		name = n
	}
	name = strings.ToLower(name)
	for _, s := range secretNames {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}
