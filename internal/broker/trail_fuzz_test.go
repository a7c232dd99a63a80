package broker_test

import (
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"handoff.dev/handoff/internal/broker"
)

// fuzzKeys are the headers FuzzParseTrail sets; bit i of its present mask
// says whether fuzzKeys[i] is in the headers at all, so that a missing
// header and an empty one are both explored.
var fuzzKeys = [...]string{
	broker.HeaderEventID,
	broker.HeaderAttempt,
	broker.HeaderDefers,
	broker.HeaderFirstAttemptAt,
	broker.HeaderFirstFailureAt,
	broker.HeaderNextDue,
	broker.HeaderDeadline,
	broker.HeaderError,
}

const allPresent = uint8(1<<len(fuzzKeys) - 1)

func FuzzParseTrail(f *testing.F) {
	const (
		t0 = "2026-01-01T00:00:00.000Z"
		t1 = "2026-01-01T00:00:10.000Z"
		t2 = "2026-01-02T00:00:00.000Z"
	)
	long := strings.Repeat("€", 200)
	seeds := []struct {
		present                                                   uint8
		eventID, attempt, defers, firstAt, failAt, nextDue, dline string
		errText                                                   string
	}{
		// Valid trails, as the sidecar writes them.
		{allPresent, "evt-1", "3", "1", t0, t1, t1, t2, "boom"},
		{allPresent &^ (1<<2 | 1<<4 | 1<<5 | 1<<7), "evt-1", "0", "", t0, "", "", t2, ""},
		{allPresent, "evt-1", "5", "5", t0, t1, t1, t2, long},
		// Counts.
		{allPresent, "evt-1", "-1", "0", t0, t1, t1, t2, ""},
		{allPresent, "evt-1", "9999999999999999999", "0", t0, t1, t1, t2, ""},
		{allPresent, "evt-1", "+5", "+0", t0, t1, t1, t2, ""},
		{allPresent, "evt-1", "0x10", "1_0", t0, t1, t1, t2, ""},
		{allPresent, "evt-1", "2", "3", t0, t1, t1, t2, ""},
		{allPresent, "evt-1", "", "", t0, t1, t1, t2, ""},
		{allPresent, "evt-1", "٣", "0", t0, t1, t1, t2, ""},
		// Times.
		{allPresent, "evt-1", "1", "0", "2026-02-30T00:00:00Z", t1, t1, t2, ""},
		{allPresent, "evt-1", "1", "0", t0, t1, t1, "2026-01-01T24:00:00Z", ""},
		{allPresent, "evt-1", "1", "0", "2026-01-01T00:00:00.123456789+05:30", t1, "2026-01-01T00:00:00-00:00", t2, ""},
		{allPresent, "evt-1", "1", "0", "0000-01-01T00:00:00Z", t1, t1, "9999-12-31T23:59:59.999Z", ""},
		{allPresent, "evt-1", "1", "0", "2026-01-01t00:00:00z", t1, t1, t2, ""},
		{allPresent, "evt-1", "1", "0", "1767225600", t1, t1, t2, ""},
		{allPresent, "evt-1", "1", "0", t0, "", "", t2, ""},
		// Strings.
		{allPresent, "", "1", "0", t0, t1, t1, t2, ""},
		{allPresent, "évt-🚀", "1", "0", t0, t1, t1, t2, "ошибка 🔑"},
		{allPresent, "evt-1", "1", "0", t0, t1, t1, t2, strings.Repeat("a", broker.MaxErrorLen-1) + "🚀"},
		{allPresent, "evt-1", "1", "0", t0, t1, t1, t2, strings.Repeat("\x80", broker.MaxErrorLen+10)},
		{allPresent, "\xff", "1", "0", t0, t1, t1, t2, "\xc3"},
		{0, "", "", "", "", "", "", "", ""},
	}
	for _, s := range seeds {
		f.Add(s.present, s.eventID, s.attempt, s.defers, s.firstAt, s.failAt, s.nextDue, s.dline, s.errText)
	}
	f.Fuzz(func(t *testing.T, present uint8, eventID, attempt, defers, firstAt, failAt, nextDue, deadline, errText string) {
		values := [...]string{eventID, attempt, defers, firstAt, failAt, nextDue, deadline, errText}
		h := broker.Headers{}
		for i, k := range fuzzKeys {
			if present&(1<<i) != 0 {
				h[k] = values[i]
			}
		}
		in := maps.Clone(h)

		got, err := broker.ParseTrail(h)
		if !maps.Equal(h, in) {
			t.Fatalf("ParseTrail changed its input: %q, was %q", h, in)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "handoff-") {
				t.Fatalf("error %q does not start with the header at fault", err)
			}
			return
		}

		if got.EventID == "" {
			t.Fatalf("accepted an empty event id")
		}
		if got.Defers < 0 || got.Attempt < got.Defers {
			t.Fatalf("accepted attempt %d, defers %d: want attempt >= defers >= 0", got.Attempt, got.Defers)
		}
		if got.EventID != h[broker.HeaderEventID] || got.Error != h[broker.HeaderError] {
			t.Fatalf("strings not read verbatim: event id %q, error %q", got.EventID, got.Error)
		}

		written := got.Headers()
		for k := range written {
			if !broker.IsOwned(k) {
				t.Fatalf("Headers() wrote %q, which is not a handoff-* header", k)
			}
		}
		again, err := broker.ParseTrail(written)
		if err != nil {
			t.Fatalf("Headers() of an accepted trail does not parse: %v\ninput:   %q\nwritten: %q", err, h, written)
		}

		// Headers keeps times to the millisecond in UTC and bounds Error;
		// everything else must come back as it was.
		want := got
		for _, p := range []*time.Time{&want.FirstAttemptAt, &want.FirstFailureAt, &want.NextDue, &want.Deadline} {
			if !p.IsZero() {
				*p = p.UTC().Truncate(time.Millisecond)
			}
		}
		checkError(t, again.Error, got.Error)
		want.Error = again.Error
		checkTrail(t, again, want)

		// After one write the trail is at a fixed point.
		if rewritten := again.Headers(); !maps.Equal(rewritten, written) {
			t.Fatalf("Headers() not stable:\nfirst:  %q\nsecond: %q", written, rewritten)
		}
	})
}

// checkError checks that the handoff-error written for orig and read back
// as got is orig cut to at most MaxErrorLen bytes, and no shorter than it must
// be when orig is valid UTF-8.
func checkError(t *testing.T, got, orig string) {
	t.Helper()
	if !strings.HasPrefix(orig, got) {
		t.Fatalf("Error %q is not a prefix of %q", got, orig)
	}
	if len(got) > broker.MaxErrorLen {
		t.Fatalf("Error has %d bytes, more than MaxErrorLen", len(got))
	}
	if len(orig) <= broker.MaxErrorLen && got != orig {
		t.Fatalf("Error %q cut to %q though within MaxErrorLen", orig, got)
	}
	if utf8.ValidString(orig) && len(orig) > broker.MaxErrorLen {
		if !utf8.ValidString(got) {
			t.Fatalf("cutting valid UTF-8 split a sequence")
		}
		if len(got) <= broker.MaxErrorLen-utf8.UTFMax {
			t.Fatalf("Error cut to %d bytes, more than one rune short of MaxErrorLen", len(got))
		}
	}
}
