package redact

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// FuzzURL builds scheme://user:pass@rest from its parts — whether or not it
// parses — and checks that the password is in neither URL's output nor
// Text's for the URL quoted in an error, as *url.Error quotes it.
func FuzzURL(f *testing.F) {
	for _, seed := range [][4]string{
		{"http", "app", "s3cret", "127.0.0.1:8080/events"},
		{"amqp", "guest", "guest", "127.0.0.1:5672/"},
		{"amqps", "u", "p%40ss", "h/vhost?heartbeat=10"},
		{"http", "app", "ab/cd", "h/events"},
		{"http", "app", "1234/5678", "h/events"},
		{"http", "app", "12?34", "h/events"},
		{"http", "app", "12#34", "h/events"},
		{"http", "app", "p@ss", "h/x@y"},
		{"http", "a/b", "s3cret", "h"},
		{"http", "a@b", "12/d", "h"},
		{"http", "app", "my pass", "h/"},
		{"http", "app", "a\"b", "h/"},
		{"http", "app", "p%zz", "h/?token=t0k"},
		{"", "app", "s3cret", "h"},
		{"1x", "app", "s3cret", "h"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	f.Fuzz(func(t *testing.T, scheme, user, pass, rest string) {
		s := scheme + "://" + user + ":" + pass + "@" + rest
		got := URL(s)
		if URL(got) != got {
			t.Errorf("URL is not stable: %q → %q → %q", s, got, URL(got))
		}
		// The password can be in the output legitimately only when it is in
		// the rest of the URL too, or is formed by the mask and its
		// neighbours (it holds the mask's letter).
		masked := scheme + "://" + user + ":" + Mask + "@" + rest
		if pass == "" || strings.Contains(pass, "x") || strings.Contains(masked, pass) {
			return
		}
		if strings.Contains(got, pass) {
			t.Fatalf("URL(%q) = %q: holds the password %q", s, got, pass)
		}
		// What net/url read as the password, when it read one.
		if u, err := url.Parse(s); err == nil && u.User != nil {
			if p, ok := u.User.Password(); ok && p != "" && !strings.Contains(p, "x") && !strings.Contains(masked, p) && strings.Contains(got, p) {
				t.Fatalf("URL(%q) = %q: holds the parsed password %q", s, got, p)
			}
		}
		if !isScheme(scheme) || scheme == "" {
			return
		}
		// In an error message, quoted.
		msg := `Post ` + strconv.Quote(s) + `: EOF`
		escaped := strconv.Quote(pass)
		escaped = escaped[1 : len(escaped)-1]
		plain := `Post ` + strconv.Quote(masked) + `: EOF`
		if strings.Contains(plain, pass) || strings.Contains(plain, escaped) {
			return
		}
		if out := Text(msg); strings.Contains(out, pass) || strings.Contains(out, escaped) {
			t.Fatalf("Text(%q) = %q: holds the password %q", msg, out, pass)
		}
	})
}
