package budget

import "time"

// Backoff is the wait between tries of something that is away — a broker
// connection, an app, a copy not yet confirmed: Min after the first failure,
// doubled after each one, never above Max. Unlike a retry's delay it has no
// jitter: a single sidecar tries one thing. The zero value is not usable.
type Backoff struct {
	Min, Max time.Duration
	next     time.Duration
}

// NewBackoff waits min, then doubles up to max.
func NewBackoff(min, max time.Duration) Backoff { return Backoff{Min: min, Max: max} }

// Next is the wait before the next try; the one after it is twice as long,
// up to Max.
func (b *Backoff) Next() time.Duration {
	if b.next == 0 {
		b.next = b.Min
	}
	d := b.next
	b.next = min(2*b.next, b.Max)
	return d
}

// Peek is what Next would return, without moving on: for a log line that
// says how long the wait will be.
func (b *Backoff) Peek() time.Duration {
	if b.next == 0 {
		return b.Min
	}
	return b.next
}

// Reset starts again from Min, once the thing tried is back.
func (b *Backoff) Reset() { b.next = 0 }
