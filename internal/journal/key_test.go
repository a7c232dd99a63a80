package journal

import (
	"bytes"
	"errors"
	"testing"
)

// trickyKeys are keys whose parts run into each other if joined naively.
var trickyKeys = []Key{
	{Source: "orders", EventID: "a"},
	{Source: "orders", EventID: "ab"},
	{Source: "orders", EventID: "a\x00"},
	{Source: "orders", EventID: "a\x00b"},
	{Source: "orders", EventID: "\x00"},
	{Source: "orders", EventID: ""},
	{Source: "orders", EventID: "a", ReplayID: "r1"},
	{Source: "orders", EventID: "a", ReplayID: "\x00"},
	{Source: "orders\x00a", EventID: ""},
	{Source: "ordersa", EventID: ""},
	{Source: "order", EventID: "sa"},
	{Source: "orders2", EventID: "a"},
	{Source: "", EventID: "", ReplayID: ""},
	{Source: "", EventID: "orders"},
	{Source: "\x01", EventID: "\x01"}, // encodes to bytes a length could be
	{Source: "\x01\x01", EventID: ""},
	{Source: "s", EventID: string(make([]byte, 200))}, // a two-byte length
	{Source: "s", EventID: string(make([]byte, 128))},
}

func TestKeyEncodeRoundTrip(t *testing.T) {
	for _, k := range trickyKeys {
		t.Run(k.String(), func(t *testing.T) {
			enc := k.encode(nil)
			rest := []byte("tail")
			got, r, err := decodeKey(append(enc, rest...))
			if err != nil {
				t.Fatalf("decodeKey: %v", err)
			}
			if got != k || !bytes.Equal(r, rest) {
				t.Errorf("decodeKey = %q, rest %q; want %q, rest %q", got, r, k, rest)
			}
		})
	}
}

// TestKeyEncodingIsPrefixFree checks what the steps bucket relies on: no
// key's encoding is a prefix of another's, so a cursor seeking one key's
// prefix never walks into another key's steps.
func TestKeyEncodingIsPrefixFree(t *testing.T) {
	for i, a := range trickyKeys {
		for j, b := range trickyKeys {
			if i == j {
				continue
			}
			ea, eb := a.encode(nil), b.encode(nil)
			if bytes.HasPrefix(eb, ea) {
				t.Errorf("encoding of %q (% x) is a prefix of %q (% x)", a, ea, b, eb)
			}
		}
	}
}

func TestKeyString(t *testing.T) {
	tests := []struct {
		name string
		key  Key
		want string
	}{
		{name: "no replay", key: Key{Source: "orders", EventID: "e1"}, want: "orders/e1"},
		{name: "replay", key: Key{Source: "orders", EventID: "e1", ReplayID: "r7"}, want: "orders/e1@r7"},
		{name: "empty", key: Key{}, want: "/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.key.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDecodeKeyErrors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{name: "empty", in: nil},
		{name: "one part", in: []byte{1, 's'}},
		{name: "two parts", in: []byte{1, 's', 1, 'e'}},
		{name: "length past the end", in: []byte{1, 's', 1, 'e', 5, 'r'}},
		{name: "length unterminated", in: []byte{0x80}},
		{name: "huge length", in: []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, rest, err := decodeKey(tt.in)
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("decodeKey(% x) = %q, % x, %v; want ErrCorrupt", tt.in, k, rest, err)
			}
		})
	}
}

// FuzzKeyDecode feeds decodeKey, which reads keys back from the file, with
// arbitrary bytes: it must not panic, and a key it reads must encode to
// bytes that read back as the same key with the same rest.
func FuzzKeyDecode(f *testing.F) {
	for _, k := range trickyKeys {
		f.Add(k.encode(nil))
		f.Add(append(k.encode(nil), 0, 0, 0, 0, 0, 0, 0, 1)) // a step key
	}
	f.Add([]byte{0x80, 0x00, 0x80, 0x00, 0x00}) // lengths in more bytes than needed
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		k, rest, err := decodeKey(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decodeKey(% x): %v is not ErrCorrupt", data, err)
			}
			return
		}
		if !bytes.HasSuffix(data, rest) {
			t.Fatalf("decodeKey(% x): rest % x is not a suffix of the input", data, rest)
		}
		enc := k.encode(nil)
		if len(enc)+len(rest) > len(data) {
			t.Fatalf("decodeKey(% x) = %q: its encoding % x is longer than what was read", data, k, enc)
		}
		k2, rest2, err := decodeKey(append(enc, rest...))
		if err != nil || k2 != k || !bytes.Equal(rest2, rest) {
			t.Fatalf("decodeKey(encode(%q) ‖ % x) = %q, % x, %v", k, rest, k2, rest2, err)
		}
	})
}
