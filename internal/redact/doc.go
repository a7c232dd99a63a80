// Package redact takes secrets out of text before it reaches a log line, an
// error, `validate` output or a health endpoint: the password of a URL's
// userinfo and the values of query parameters named like secrets become
// [Mask], so http://app:s3cret@127.0.0.1:8080/events is shown as
// http://app:xxxxx@127.0.0.1:8080/events.
//
// [URL] redacts one URL, and copes with one that does not parse: its
// password is masked all the same. [Text] redacts every URL in a message,
// bare or quoted as %q writes it. [Error] wraps an error whose message
// carries a URL — a *url.Error from net/url or net/http, or a wrapped one
// from a client library's dial — so that it prints redacted and still
// unwraps to the original.
//
// Every config field that can hold a secret must reach output only through
// this package: today handler.url and sources[].rabbitmq.url; a field added
// later (Kafka SASL, a TLS key password) must be redacted here too, and its
// acceptance test must grep the run log, `validate` output and health
// endpoints for it.
//
// # Caveats
//
//   - The username is kept, for diagnosis; a secret carried as the username
//     alone (a token in place of a user) is not masked.
//   - Any '@' after the scheme is taken to end a userinfo, so a URL with a
//     port and an '@' in its path or query (http://h:80/x?mail=a@b) is
//     masked from the port on: a password with an unescaped '/', '?' or '#'
//     cannot be told apart from it, and showing too little is the safe side.
//   - Text finds URLs in a message by whitespace and by quoted strings; a bare
//     URL whose password holds a space is masked only in part.
//   - An [Error] unwraps to the original: code that reads a *url.Error's URL
//     field through errors.As holds the unredacted URL.
package redact
