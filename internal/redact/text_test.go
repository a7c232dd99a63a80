package redact

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestText(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"no URL", "broker not connected", "broker not connected"},
		{"email", "mail a@b.example now", "mail a@b.example now"},
		{"bare URL", "dial http://app:s3cret@h/events: refused", "dial http://app:xxxxx@h/events: refused"},
		{"quoted URL", `Post "http://app:s3cret@h/events": EOF`, `Post "http://app:xxxxx@h/events": EOF`},
		{"quoted URL with an escaped quote", `parse "http://app:a\"b@h/": invalid`, `parse "http://app:xxxxx@h/": invalid`},
		{"backquoted", "cannot unmarshal `http://app:s3cret@h/` into int", "cannot unmarshal \"http://app:xxxxx@h/\" into int"},
		{"quoted inside quoted", `err="dial: parse \"amqp://u:s3cret@h/\": bad"`, `err="dial: parse \"amqp://u:xxxxx@h/\": bad"`},
		{"two URLs on lines", "a http://u:one@h\nb amqp://u:two@h/", "a http://u:xxxxx@h\nb amqp://u:xxxxx@h/"},
		{"unterminated quote is part of the word", `http://u:a"b@h/`, `http://u:xxxxx@h/`},
		{"query secret", "GET http://h/x?token=t0k failed", "GET http://h/x?token=xxxxx failed"},
		{"user:password@host without a scheme", "seed u:s3cret@h:9092 down", "seed u:xxxxx@h:9092 down"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Text(tt.in); got != tt.want {
				t.Errorf("Text(%q) =\n  %q, want\n  %q", tt.in, got, tt.want)
			}
		})
	}
}

// The errors the libraries we use really return for URLs with passwords.
func TestError(t *testing.T) {
	const pass = "Pw-7f3a"
	_, parseErr := url.Parse("http://app:" + pass + "/x@h/events") // invalid port ":Pw-7f3a"
	_, amqpErr := amqp.DialConfig("amqp://guest:"+pass+"/x@127.0.0.1:1/", amqp.Config{})
	_, fragmentErr := amqp.DialConfig("amqp://guest:"+pass+"#x@127.0.0.1:1/", amqp.Config{}) // parse "amqp://guest:Pw-7f3a": invalid port
	_, reqErr := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://app:"+pass+"@h:bad/", nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: the call fails to connect
	_, postErr := http.Post("http://app:"+pass+"@"+addr+"/events", "text/plain", nil)
	_, amqpDialErr := amqp.DialConfig("amqp://guest:"+pass+"@"+addr+"/", amqp.Config{})

	tests := []struct {
		name string
		err  error
		want string // in the redacted message
	}{
		{"url.Parse", parseErr, `parse "http://app:xxxxx@h/events": not a valid URL`},
		{"amqp091-go parse, wrapped", fmt.Errorf("dial: %w", amqpErr), `dial: parse "amqp://guest:xxxxx@127.0.0.1:1/": not a valid URL`},
		{"a password cut at its '#'", fragmentErr, `parse "amqp://guest:xxxxx": not a valid URL`},
		{"http.NewRequest", reqErr, `parse "http://app:xxxxx@h:bad/"`},
		{"http.Client", postErr, `Post "http://app:xxxxx@` + addr + `/events": dial tcp`},
		{"amqp091-go dial", amqpDialErr, "connect: connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err == nil {
				t.Fatal("the library returned no error")
			}
			got := Error(tt.err)
			if msg := got.Error(); strings.Contains(msg, pass) || strings.Contains(msg, "Pw") || !strings.Contains(msg, tt.want) {
				t.Errorf("Error(%q) = %q: want no password, and %q", tt.err, msg, tt.want)
			}
			if !errors.Is(got, tt.err) {
				t.Error("the redacted error does not unwrap to the original")
			}
		})
	}
	if Error(nil) != nil {
		t.Error("Error(nil) is not nil")
	}
	plain := errors.New("broker not connected")
	if Error(plain) != plain {
		t.Error("an error without secrets is not returned as it is")
	}
}
