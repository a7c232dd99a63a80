package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strconv"
	"strings"
	"testing"
	"time"
)

// withCRC appends the checksum Decode expects to body.
func withCRC(body []byte) []byte {
	out := append([]byte(nil), body...)
	return binary.LittleEndian.AppendUint32(out, crc32.Checksum(body, castagnoli))
}

// body strips the checksum off an encoding.
func body(enc []byte) []byte { return append([]byte(nil), enc[:len(enc)-4]...) }

// fullRecord sets every field of Record to a non-zero value.
func fullRecord() Record {
	return Record{
		Kind:    Transferring,
		At:      time.Date(2031, 5, 6, 7, 8, 9, 123456789, time.FixedZone("X", 3600)),
		Hop:     3,
		Attempt: 7,
		Outcome: outRetry,
		Status:  503,
		Latency: 1500 * time.Millisecond,
		Dest:    "retry.1s",
		Detail:  "upstream said: 503 Service Unavailable",
		Trail: map[string]string{
			"handoff-hops":          "3",
			"handoff-first-attempt": "2031-05-06T06:08:09Z",
			"handoff-reason":        "http 503",
			"":                      "",
			"ünïcødé\x00":           "\xff\xfe",
		},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		rec  Record
		// wantLen, when set, is the exact encoded length: zero fields are
		// left out, so it tells which fields were written.
		wantLen int
		// want, when set, is what Decode returns instead of rec.
		want *Record
	}{
		{name: "received, no fields", rec: Record{Kind: Received}, wantLen: 2 + 4},
		{name: "attempt, no fields", rec: Record{Kind: Attempt}, wantLen: 2 + 4},
		{name: "outcome, no fields", rec: Record{Kind: Outcome}, wantLen: 2 + 4},
		{name: "transferring, no fields", rec: Record{Kind: Transferring}, wantLen: 2 + 4},
		{name: "transferred, no fields", rec: Record{Kind: Transferred}, wantLen: 2 + 4},
		{name: "settled, no fields", rec: Record{Kind: Settled}, wantLen: 2 + 4},
		{name: "released, no fields", rec: Record{Kind: Released}, wantLen: 2 + 4},
		{name: "empty trail is left out", rec: Record{Kind: Transferring, Trail: map[string]string{}}, wantLen: 2 + 4, want: &Record{Kind: Transferring}},
		{name: "hop only", rec: Record{Kind: Received, Hop: 1}, wantLen: 2 + 3 + 4},
		{name: "dest only", rec: Record{Kind: Transferring, Dest: "dlq"}, wantLen: 2 + 5 + 4},
		{name: "received", rec: Record{Kind: Received, At: at(0), Hop: 2}},
		{name: "attempt", rec: Record{Kind: Attempt, At: at(time.Second), Hop: 2, Attempt: 3}},
		{name: "outcome", rec: Record{Kind: Outcome, At: at(2 * time.Second), Hop: 2, Attempt: 3, Outcome: outRetry, Status: 429, Latency: 42 * time.Millisecond, Detail: "rate limited"}},
		{name: "transferring", rec: Record{Kind: Transferring, At: at(3 * time.Second), Hop: 3, Attempt: 3, Dest: "retry.1s", Trail: map[string]string{"handoff-hops": "3"}}},
		{name: "transferred", rec: Record{Kind: Transferred, At: at(4 * time.Second), Hop: 3}},
		{name: "settled", rec: Record{Kind: Settled, At: at(5 * time.Second), Hop: 2, Detail: "copied"}},
		{name: "released", rec: Record{Kind: Released, At: at(6 * time.Second), Hop: 2, Detail: "shutdown"}},
		{name: "every field", rec: fullRecord()},
		{name: "the epoch itself is kept", rec: Record{Kind: Received, At: time.Unix(0, 0)}, wantLen: 2 + 3 + 4},
		{name: "before the epoch", rec: Record{Kind: Received, At: time.Date(1960, 1, 1, 0, 0, 0, 1, time.UTC)}},
		{name: "wall clock with monotonic reading", rec: Record{Kind: Attempt, At: time.Now(), Attempt: 1}},
		{name: "negative numbers", rec: Record{Kind: Outcome, Hop: -1, Attempt: -2, Status: -3, Latency: -time.Second}},
		{name: "extreme numbers", rec: Record{Kind: Outcome, Hop: 1<<63 - 1, Attempt: -1 << 63, Outcome: 255, Status: 1<<63 - 1, Latency: -1 << 63}},
		{name: "binary strings", rec: Record{Kind: Settled, Dest: "\x00\x01\x02", Detail: strings.Repeat("\xff", 300)}},
		{name: "large trail", rec: Record{Kind: Transferring, Trail: func() map[string]string {
			m := map[string]string{}
			for i := range 200 {
				m[strings.Repeat("k", i)] = strings.Repeat("v", 200-i)
			}
			return m
		}()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enc := tt.rec.Encode(nil)
			if tt.wantLen != 0 && len(enc) != tt.wantLen {
				t.Errorf("encoded length = %d, want %d (% x)", len(enc), tt.wantLen, enc)
			}
			got, err := Decode(enc)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			want := tt.rec
			if tt.want != nil {
				want = *tt.want
			}
			if !equalRecord(got, want) {
				t.Errorf("Decode(Encode(r)) = %+v, want %+v", got, want)
			}
			if again := got.Encode(nil); !bytes.Equal(again, enc) {
				t.Errorf("Encode is not stable:\n first % x\nsecond % x", enc, again)
			}
			// Encode appends: what was in dst stays, the record follows.
			prefix := []byte("prefix")
			app := tt.rec.Encode(append([]byte(nil), prefix...))
			if !bytes.HasPrefix(app, prefix) || !bytes.Equal(app[len(prefix):], enc) {
				t.Errorf("Encode(dst) = % x, want dst followed by % x", app, enc)
			}
		})
	}
}

func TestRecordEncodeIgnoresMapOrder(t *testing.T) {
	// Map iteration is random: many encodings of the same trail must agree.
	r := fullRecord()
	want := r.Encode(nil)
	for i := range 50 {
		c := r
		c.Trail = map[string]string{}
		for k, v := range r.Trail {
			c.Trail[k] = v
		}
		if got := c.Encode(nil); !bytes.Equal(got, want) {
			t.Fatalf("encoding %d differs:\n got % x\nwant % x", i, got, want)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	full := fullRecord()
	valid := full.Encode(nil)
	// A hand-made body: version, kind, then fields.
	field := func(tag byte, v ...byte) []byte {
		return append(append([]byte{tag}, binary.AppendUvarint(nil, uint64(len(v)))...), v...)
	}
	rec := func(fields ...[]byte) []byte {
		b := []byte{recordVersion, byte(Attempt)}
		for _, f := range fields {
			b = append(b, f...)
		}
		return withCRC(b)
	}
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{name: "nil", in: nil, want: ErrCorrupt},
		{name: "empty", in: []byte{}, want: ErrCorrupt},
		{name: "five bytes", in: valid[:5], want: ErrCorrupt},
		{name: "checksum only", in: withCRC(nil), want: ErrCorrupt},
		{name: "one byte and checksum", in: withCRC([]byte{recordVersion}), want: ErrCorrupt},
		{name: "truncated by one byte", in: valid[:len(valid)-1], want: ErrCorrupt},
		{name: "trailing byte", in: append(append([]byte(nil), valid...), 0), want: ErrCorrupt},
		{name: "checksum zeroed", in: append(body(valid), 0, 0, 0, 0), want: ErrCorrupt},
		{name: "version 0", in: withCRC([]byte{0, byte(Received)}), want: ErrCorrupt},
		{name: "version 2", in: withCRC([]byte{2, byte(Received)}), want: ErrVersion},
		{name: "version 255", in: withCRC([]byte{255, byte(Received)}), want: ErrVersion},
		{name: "newer version with fields this build cannot read", in: withCRC([]byte{recordVersion + 1, 99, 0xff, 0xff}), want: ErrVersion},
		{name: "kind 0", in: withCRC([]byte{recordVersion, 0}), want: ErrCorrupt},
		{name: "kind past the last", in: withCRC([]byte{recordVersion, byte(maxKind)}), want: ErrCorrupt},
		{name: "kind 255", in: withCRC([]byte{recordVersion, 255}), want: ErrCorrupt},
		{name: "tag without length", in: rec([]byte{tagHop}), want: ErrCorrupt},
		{name: "length past the end", in: rec([]byte{tagDest, 5, 'a', 'b'}), want: ErrCorrupt},
		{name: "length unterminated", in: rec([]byte{tagDest, 0x80}), want: ErrCorrupt},
		{name: "length overflows", in: rec([]byte{tagDest, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}), want: ErrCorrupt},
		{name: "length near max uint64", in: rec([]byte{tagDest, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}), want: ErrCorrupt},
		{name: "unknown tag with length past the end", in: rec([]byte{200, 9, 1}), want: ErrCorrupt},
		{name: "empty number", in: rec(field(tagHop)), want: ErrCorrupt},
		{name: "number with trailing byte", in: rec(field(tagAttempt, 2, 0)), want: ErrCorrupt},
		{name: "number unterminated", in: rec(field(tagStatus, 0x80)), want: ErrCorrupt},
		{name: "time unterminated", in: rec(field(tagAt, 0x80, 0x80)), want: ErrCorrupt},
		{name: "latency overflows", in: rec(field(tagLatency, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)), want: ErrCorrupt},
		{name: "outcome 256", in: rec(field(tagOutcome, binary.AppendVarint(nil, 256)...)), want: ErrCorrupt},
		{name: "outcome -1", in: rec(field(tagOutcome, binary.AppendVarint(nil, -1)...)), want: ErrCorrupt},
		{name: "trail key past the end", in: rec(field(tagTrail, 5, 'k')), want: ErrCorrupt},
		{name: "trail key unterminated", in: rec(field(tagTrail, 0x80)), want: ErrCorrupt},
		{name: "trail value missing", in: rec(field(tagTrail, 1, 'k')), want: ErrCorrupt},
		{name: "trail value past the end", in: rec(field(tagTrail, 1, 'k', 3, 'v')), want: ErrCorrupt},
		{name: "good field then bad", in: rec(field(tagHop, 2), []byte{tagDest, 9}), want: ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Decode(tt.in)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Decode(% x) = %+v, %v; want %v", tt.in, r, err, tt.want)
			}
			// A newer version is not damage: callers tell the two apart.
			if tt.want == ErrVersion && errors.Is(err, ErrCorrupt) {
				t.Errorf("Decode: %v is also ErrCorrupt", err)
			}
			if tt.want == ErrCorrupt && errors.Is(err, ErrVersion) {
				t.Errorf("Decode: %v is also ErrVersion", err)
			}
		})
	}
}

func TestDecodeDamage(t *testing.T) {
	full := fullRecord()
	valid := full.Encode(nil)
	tests := []struct {
		name   string
		damage func(yield func(string, []byte))
	}{
		{name: "every truncation", damage: func(yield func(string, []byte)) {
			for n := range len(valid) {
				yield("len "+strconv.Itoa(n), append([]byte(nil), valid[:n]...))
			}
		}},
		{name: "every single bit flip", damage: func(yield func(string, []byte)) {
			for i := range len(valid) * 8 {
				b := append([]byte(nil), valid...)
				b[i/8] ^= 1 << (i % 8)
				yield("bit "+strconv.Itoa(i), b)
			}
		}},
		{name: "every byte zeroed", damage: func(yield func(string, []byte)) {
			for i := range valid {
				if valid[i] == 0 {
					continue
				}
				b := append([]byte(nil), valid...)
				b[i] = 0
				yield("byte "+strconv.Itoa(i), b)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := 0
			tt.damage(func(what string, b []byte) {
				n++
				if r, err := Decode(b); !errors.Is(err, ErrCorrupt) {
					t.Errorf("%s: Decode = %+v, %v; want ErrCorrupt", what, r, err)
				}
			})
			if n == 0 {
				t.Fatal("no damaged input was tried")
			}
		})
	}
}

func TestDecodeSkipsUnknownFields(t *testing.T) {
	want := fullRecord()
	base := body(want.Encode(nil))
	tests := []struct {
		name  string
		extra []byte
	}{
		{name: "tag 200 with a value", extra: []byte{200, 3, 'x', 'y', 'z'}},
		{name: "tag 200 empty", extra: []byte{200, 0}},
		{name: "the next tag to be used", extra: []byte{tagPosition + 1, 1, 0xff}},
		{name: "tag 0", extra: []byte{0, 2, 1, 2}},
		{name: "tag 255 with a long value", extra: append([]byte{255, 0x80, 0x02}, bytes.Repeat([]byte{7}, 256)...)},
		{name: "several unknown fields", extra: []byte{200, 1, 1, 201, 0, 202, 2, 0x80, 0x80}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, where := range []string{"after the fields", "before the fields"} {
				var b []byte
				if where == "after the fields" {
					b = append(append([]byte(nil), base...), tt.extra...)
				} else {
					b = append(append(append([]byte(nil), base[:2]...), tt.extra...), base[2:]...)
				}
				got, err := Decode(withCRC(b))
				if err != nil {
					t.Fatalf("%s: Decode: %v", where, err)
				}
				if !equalRecord(got, want) {
					t.Errorf("%s: Decode = %+v, want %+v", where, got, want)
				}
			}
		})
	}
}

func TestKindString(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		want string
	}{
		{name: "received", kind: Received, want: "received"},
		{name: "attempt", kind: Attempt, want: "attempt"},
		{name: "outcome", kind: Outcome, want: "outcome"},
		{name: "transferring", kind: Transferring, want: "transferring"},
		{name: "transferred", kind: Transferred, want: "transferred"},
		{name: "settled", kind: Settled, want: "settled"},
		{name: "released", kind: Released, want: "released"},
		{name: "zero", kind: 0, want: "kind(0)"},
		{name: "past the last", kind: maxKind, want: "kind(9)"},
		{name: "255", kind: 255, want: "kind(255)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.kind.String(); got != tt.want {
				t.Errorf("Kind(%d).String() = %q, want %q", uint8(tt.kind), got, tt.want)
			}
		})
	}
}
