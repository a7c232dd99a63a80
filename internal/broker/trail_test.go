package broker_test

import (
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"handoff.dev/handoff/internal/broker"
)

// checkTrail fails t unless got equals want field by field. Times are
// compared with Equal, and a non-zero parsed time must be in UTC.
func checkTrail(t *testing.T, got, want broker.Trail) {
	t.Helper()
	strs := []struct {
		field     string
		got, want string
	}{
		{"EventID", got.EventID, want.EventID},
		{"ErrorClass", got.ErrorClass, want.ErrorClass},
		{"Error", got.Error, want.Error},
		{"Origin", got.Origin, want.Origin},
		{"DeadReason", got.DeadReason, want.DeadReason},
		{"ReplayID", got.ReplayID, want.ReplayID},
	}
	for _, s := range strs {
		if s.got != s.want {
			t.Errorf("%s = %q, want %q", s.field, s.got, s.want)
		}
	}
	if got.Attempt != want.Attempt {
		t.Errorf("Attempt = %d, want %d", got.Attempt, want.Attempt)
	}
	if got.Defers != want.Defers {
		t.Errorf("Defers = %d, want %d", got.Defers, want.Defers)
	}
	if got.Stops != want.Stops || got.AloneStops != want.AloneStops {
		t.Errorf("Stops, AloneStops = %d, %d, want %d, %d", got.Stops, got.AloneStops, want.Stops, want.AloneStops)
	}
	if got.Redelivered != want.Redelivered {
		t.Errorf("Redelivered = %v, want %v", got.Redelivered, want.Redelivered)
	}
	times := []struct {
		field     string
		got, want time.Time
	}{
		{"FirstAttemptAt", got.FirstAttemptAt, want.FirstAttemptAt},
		{"FirstFailureAt", got.FirstFailureAt, want.FirstFailureAt},
		{"NextDue", got.NextDue, want.NextDue},
		{"Deadline", got.Deadline, want.Deadline},
	}
	for _, tm := range times {
		if !tm.got.Equal(tm.want) {
			t.Errorf("%s = %v, want %v", tm.field, tm.got, tm.want)
		}
		if !tm.got.IsZero() && tm.got.Location() != time.UTC {
			t.Errorf("%s location = %v, want UTC", tm.field, tm.got.Location())
		}
	}
}

func TestTrailRoundTrip(t *testing.T) {
	base := time.Date(2026, 3, 14, 15, 9, 26, 535_000_000, time.UTC)
	ist := time.FixedZone("IST", 5*3600+1800)
	tests := []struct {
		name  string
		trail broker.Trail
		// want is the trail expected back; the zero value means trail itself.
		want *broker.Trail
	}{
		{
			name: "every field",
			trail: broker.Trail{
				EventID:        "evt-1",
				Attempt:        7,
				Defers:         2,
				FirstAttemptAt: base,
				FirstFailureAt: base.Add(time.Second),
				NextDue:        base.Add(time.Minute),
				Deadline:       base.Add(24 * time.Hour),
				ErrorClass:     "transient",
				Error:          "connection refused",
				Origin:         "rabbitmq:orders",
				DeadReason:     "max-attempts",
				ReplayID:       "replay-42",
				Stops:          2,
				AloneStops:     1,
				Redelivered:    true,
			},
		},
		{
			name: "only what is always written",
			trail: broker.Trail{
				EventID:        "evt-2",
				Attempt:        0,
				FirstAttemptAt: base,
				Deadline:       base.Add(time.Hour),
			},
		},
		{
			name: "every attempt deferred",
			trail: broker.Trail{
				EventID:        "evt-3",
				Attempt:        5,
				Defers:         5,
				FirstAttemptAt: base,
				Deadline:       base.Add(time.Hour),
			},
		},
		{
			name: "unicode in string fields",
			trail: broker.Trail{
				EventID:        "événement-🚀",
				Attempt:        1,
				FirstAttemptAt: base,
				Deadline:       base.Add(time.Hour),
				ErrorClass:     "永久",
				Error:          "ошибка: ключ не найден 🔑",
				Origin:         "kafka:заказы/3/1207",
				DeadReason:     "ungültig",
				ReplayID:       "재생-1",
			},
		},
		{
			name: "times in another zone come back in UTC",
			trail: broker.Trail{
				EventID:        "evt-4",
				Attempt:        1,
				FirstAttemptAt: base.In(ist),
				NextDue:        base.Add(time.Minute).In(ist),
				Deadline:       base.Add(time.Hour).In(ist),
			},
		},
		{
			name: "times are kept to the millisecond",
			trail: broker.Trail{
				EventID:        "evt-5",
				Attempt:        1,
				FirstAttemptAt: base.Add(999_999 * time.Nanosecond),
				FirstFailureAt: base.Add(time.Second + 1),
				Deadline:       base.Add(time.Hour + 500*time.Microsecond),
			},
			want: &broker.Trail{
				EventID:        "evt-5",
				Attempt:        1,
				FirstAttemptAt: base,
				FirstFailureAt: base.Add(time.Second),
				Deadline:       base.Add(time.Hour),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := broker.ParseTrail(tt.trail.Headers())
			if err != nil {
				t.Fatalf("ParseTrail(Headers()) error: %v", err)
			}
			want := tt.trail
			if tt.want != nil {
				want = *tt.want
			}
			checkTrail(t, got, want)
		})
	}
}

func TestTrailHeadersLeavesOutZeroFields(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	const atStr = "2026-01-02T03:04:05.006Z"
	// always is what Headers writes for the zero-valued fields of every case.
	always := broker.Headers{broker.HeaderEventID: "e", broker.HeaderAttempt: "3"}
	tests := []struct {
		name  string
		trail broker.Trail
		extra broker.Headers
	}{
		{name: "nothing optional", extra: broker.Headers{}},
		{name: "defers", trail: broker.Trail{Defers: 1}, extra: broker.Headers{broker.HeaderDefers: "1"}},
		{name: "first attempt at", trail: broker.Trail{FirstAttemptAt: at}, extra: broker.Headers{broker.HeaderFirstAttemptAt: atStr}},
		{name: "first failure at", trail: broker.Trail{FirstFailureAt: at}, extra: broker.Headers{broker.HeaderFirstFailureAt: atStr}},
		{name: "next due", trail: broker.Trail{NextDue: at}, extra: broker.Headers{broker.HeaderNextDue: atStr}},
		{name: "deadline", trail: broker.Trail{Deadline: at}, extra: broker.Headers{broker.HeaderDeadline: atStr}},
		{name: "error class", trail: broker.Trail{ErrorClass: "c"}, extra: broker.Headers{broker.HeaderErrorClass: "c"}},
		{name: "error", trail: broker.Trail{Error: "boom"}, extra: broker.Headers{broker.HeaderError: "boom"}},
		{name: "origin", trail: broker.Trail{Origin: "o"}, extra: broker.Headers{broker.HeaderOrigin: "o"}},
		{name: "dead reason", trail: broker.Trail{DeadReason: "r"}, extra: broker.Headers{broker.HeaderDeadReason: "r"}},
		{name: "replay id", trail: broker.Trail{ReplayID: "p"}, extra: broker.Headers{broker.HeaderReplayID: "p"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := tt.trail
			tr.EventID, tr.Attempt = "e", 3
			want := maps.Clone(always)
			maps.Copy(want, tt.extra)
			got := tr.Headers()
			if !maps.Equal(got, want) {
				t.Errorf("Headers() = %v, want %v", got, want)
			}
			for k := range got {
				if !broker.IsOwned(k) {
					t.Errorf("Headers() wrote %q, which is not a handoff-* header", k)
				}
			}
		})
	}
}

func TestTrailHeadersTruncatesError(t *testing.T) {
	const n = broker.MaxErrorLen
	a := func(k int) string { return strings.Repeat("a", k) }
	tests := []struct {
		name string
		err  string
		want string
	}{
		{name: "ascii at the limit", err: a(n), want: a(n)},
		{name: "ascii one past the limit", err: a(n + 1), want: a(n)},
		{name: "2-byte rune across the limit", err: a(n-1) + "é", want: a(n - 1)},
		{name: "2-byte rune ending at the limit", err: a(n-2) + "é" + "x", want: a(n-2) + "é"},
		{name: "3-byte rune across the limit by one", err: a(n-1) + "€", want: a(n - 1)},
		{name: "3-byte rune across the limit by two", err: a(n-2) + "€", want: a(n - 2)},
		{name: "3-byte rune ending at the limit", err: a(n-3) + "€" + "x", want: a(n-3) + "€"},
		{name: "4-byte rune across the limit by one", err: a(n-1) + "🚀", want: a(n - 1)},
		{name: "4-byte rune across the limit by three", err: a(n-3) + "🚀", want: a(n - 3)},
		{name: "4-byte rune ending at the limit", err: a(n-4) + "🚀" + "x", want: a(n-4) + "🚀"},
		{name: "only 3-byte runes", err: strings.Repeat("€", 200), want: strings.Repeat("€", n/3)},
		{name: "only 4-byte runes", err: strings.Repeat("🚀", 200), want: strings.Repeat("🚀", n/4)},
		{name: "only 2-byte runes, odd offset", err: "x" + strings.Repeat("é", 300), want: "x" + strings.Repeat("é", (n-1)/2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := broker.Trail{
				EventID:        "e",
				Attempt:        1,
				FirstAttemptAt: time.Unix(0, 0),
				Deadline:       time.Unix(60, 0),
				Error:          tt.err,
			}
			h := tr.Headers()
			got := h[broker.HeaderError]
			if got != tt.want {
				t.Errorf("handoff-error has %d bytes ending %q, want %d bytes ending %q",
					len(got), tail(got), len(tt.want), tail(tt.want))
			}
			if len(got) > n {
				t.Errorf("handoff-error has %d bytes, more than MaxErrorLen %d", len(got), n)
			}
			if !utf8.ValidString(got) {
				t.Errorf("handoff-error is not valid UTF-8: ends %q", tail(got))
			}
			parsed, err := broker.ParseTrail(h)
			if err != nil {
				t.Fatalf("ParseTrail: %v", err)
			}
			if parsed.Error != tt.want {
				t.Errorf("parsed Error has %d bytes, want %d", len(parsed.Error), len(tt.want))
			}
		})
	}
}

func tail(s string) string {
	if len(s) > 8 {
		return s[len(s)-8:]
	}
	return s
}

// validHeaders is a trail as the sidecar writes it, for tests to break.
func validHeaders() broker.Headers {
	return broker.Headers{
		broker.HeaderEventID:        "evt-1",
		broker.HeaderAttempt:        "3",
		broker.HeaderDefers:         "1",
		broker.HeaderFirstAttemptAt: "2026-01-01T00:00:00.000Z",
		broker.HeaderFirstFailureAt: "2026-01-01T00:00:01.000Z",
		broker.HeaderNextDue:        "2026-01-01T00:00:11.000Z",
		broker.HeaderDeadline:       "2026-01-02T00:00:00.000Z",
	}
}

func TestParseTrailErrors(t *testing.T) {
	if _, err := broker.ParseTrail(validHeaders()); err != nil {
		t.Fatalf("ParseTrail(validHeaders()) error: %v; every case below breaks one header of it", err)
	}
	tests := []struct {
		name string
		key  string
		// value replaces the header; del removes it instead.
		value string
		del   bool
	}{
		{name: "event id missing", key: broker.HeaderEventID, del: true},
		{name: "event id empty", key: broker.HeaderEventID, value: ""},
		{name: "attempt missing", key: broker.HeaderAttempt, del: true},
		{name: "attempt empty", key: broker.HeaderAttempt, value: ""},
		{name: "attempt garbage", key: broker.HeaderAttempt, value: "three"},
		{name: "attempt negative", key: broker.HeaderAttempt, value: "-1"},
		{name: "attempt fractional", key: broker.HeaderAttempt, value: "1.5"},
		{name: "attempt overflows int", key: broker.HeaderAttempt, value: "9999999999999999999"},
		{name: "attempt with space", key: broker.HeaderAttempt, value: " 3"},
		{name: "defers garbage", key: broker.HeaderDefers, value: "x"},
		{name: "defers negative", key: broker.HeaderDefers, value: "-1"},
		{name: "defers empty", key: broker.HeaderDefers, value: ""},
		{name: "defers exceed attempt", key: broker.HeaderDefers, value: "4"},
		{name: "first attempt at missing", key: broker.HeaderFirstAttemptAt, del: true},
		{name: "first attempt at empty", key: broker.HeaderFirstAttemptAt, value: ""},
		{name: "first attempt at garbage", key: broker.HeaderFirstAttemptAt, value: "yesterday"},
		{name: "first attempt at unix seconds", key: broker.HeaderFirstAttemptAt, value: "1767225600"},
		{name: "deadline missing", key: broker.HeaderDeadline, del: true},
		{name: "deadline day out of range", key: broker.HeaderDeadline, value: "2026-02-30T00:00:00Z"},
		{name: "deadline without zone", key: broker.HeaderDeadline, value: "2026-01-02T00:00:00"},
		{name: "first failure at garbage", key: broker.HeaderFirstFailureAt, value: "soon"},
		{name: "next due hour 24", key: broker.HeaderNextDue, value: "2026-01-01T24:00:00Z"},
		{name: "next due empty", key: broker.HeaderNextDue, value: ""},
		{name: "redelivered false", key: broker.HeaderRedelivered, value: "false"},
		{name: "redelivered garbage", key: broker.HeaderRedelivered, value: "yes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := validHeaders()
			if tt.del {
				delete(h, tt.key)
			} else {
				h[tt.key] = tt.value
			}
			_, err := broker.ParseTrail(h)
			if err == nil {
				t.Fatalf("ParseTrail succeeded, want an error naming %s", tt.key)
			}
			if !strings.Contains(err.Error(), tt.key) {
				t.Errorf("error %q does not name %s", err, tt.key)
			}
		})
	}
}

// TestParseTrailResultWritesBack checks that whatever time ParseTrail
// accepts, the Headers of the parsed trail can be parsed again: otherwise the
// next hop dead-letters the copy as malformed.
func TestParseTrailResultWritesBack(t *testing.T) {
	tests := []struct {
		name     string
		deadline string
		// mayReject allows ParseTrail to refuse the time instead.
		mayReject bool
	}{
		{name: "UTC", deadline: "2026-01-02T00:00:00.000Z"},
		{name: "positive offset", deadline: "2026-01-02T05:30:00+05:30"},
		{name: "nanoseconds", deadline: "2026-01-02T00:00:00.123456789Z"},
		{name: "first representable instant", deadline: "0000-01-01T00:00:00Z"},
		{name: "last representable instant", deadline: "9999-12-31T23:59:59.999Z"},
		{name: "offset moves UTC before year 0000", deadline: "0000-01-01T00:00:00+01:00", mayReject: true},
		{name: "offset moves UTC past year 9999", deadline: "9999-12-31T23:59:59-23:59", mayReject: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := validHeaders()
			h[broker.HeaderDeadline] = tt.deadline
			first, err := broker.ParseTrail(h)
			if err != nil {
				if tt.mayReject {
					// Rejecting is fine; accepting a time that cannot
					// be written back is not.
					return
				}
				t.Fatalf("ParseTrail: %v", err)
			}
			written := first.Headers()
			second, err := broker.ParseTrail(written)
			if err != nil {
				t.Fatalf("ParseTrail accepted %s %q, but its Headers() wrote %q, which does not parse: %v",
					broker.HeaderDeadline, tt.deadline, written[broker.HeaderDeadline], err)
			}
			if want := first.Deadline.Truncate(time.Millisecond); !second.Deadline.Equal(want) {
				t.Errorf("Deadline after write back = %v, want %v", second.Deadline, want)
			}
		})
	}
}

func TestCopyIdentityNeedsEventIDAndHop(t *testing.T) {
	for _, h := range []broker.Headers{{}, {broker.HeaderEventID: "e"}, {broker.HeaderHops: "1"}} {
		if _, err := broker.CopyIdentity(h); err == nil {
			t.Errorf("broker.CopyIdentity(%v) = nil error, want one", h)
		}
	}
	id, err := broker.CopyIdentity(broker.Headers{broker.HeaderEventID: "e", broker.HeaderHops: "2", broker.HeaderReplayID: "r"})
	if err != nil || id != [3]string{"e", "r", "2"} {
		t.Errorf("CopyIdentity = %v, %v", id, err)
	}
}
