package journal

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// FuzzDecode feeds Decode arbitrary bytes, both as they come and with a valid
// checksum appended (random bytes almost never carry a valid CRC-32C, so
// without the second form the fuzzer would hardly get past the checksum).
func FuzzDecode(f *testing.F) {
	seeds := []Record{
		{Kind: Received},
		{Kind: Received, At: at(0), Hop: 1},
		{Kind: Attempt, At: at(time.Second), Attempt: 1},
		{Kind: Outcome, At: at(2 * time.Second), Attempt: 1, Outcome: outRetry, Status: 503, Latency: time.Second, Detail: "http 503"},
		{Kind: Transferring, At: at(3 * time.Second), Hop: 1, Attempt: 1, Dest: "retry.1s", Trail: map[string]string{"handoff-hops": "1", "": ""}},
		{Kind: Transferred, At: at(4 * time.Second), Hop: 1},
		{Kind: Settled, At: time.Unix(0, 0), Detail: "copied"},
		{Kind: Released, At: time.Unix(0, -1), Hop: -1, Status: -1, Latency: -1},
		fullRecord(),
	}
	for _, r := range seeds {
		enc := r.Encode(nil)
		f.Add(enc)
		f.Add(body(enc)) // the fuzz target adds the checksum itself
	}
	tricky := [][]byte{
		nil,
		{},
		{recordVersion},
		{recordVersion, byte(Received)},
		{recordVersion + 1, byte(Received)},
		{0, byte(Received)},
		{recordVersion, 0},
		{recordVersion, byte(maxKind)},
		{recordVersion, byte(Attempt), tagAttempt, 0x80},
		{recordVersion, byte(Attempt), tagAttempt, 2, 0x80, 0x00},                        // a number in two bytes where one would do
		{recordVersion, byte(Attempt), tagDest, 0x80, 0x00},                              // a length in two bytes
		{recordVersion, byte(Attempt), tagHop, 1, 2, tagHop, 1, 4},                       // a field twice
		{recordVersion, byte(Attempt), tagHop, 1, 0},                                     // an explicit zero
		{recordVersion, byte(Transferring), tagTrail, 4, 1, 'k', 1, 'v'},                 // trail
		{recordVersion, byte(Transferring), tagTrail, 8, 1, 'k', 1, 'a', 1, 'k', 1, 'b'}, // a trail key twice
		{recordVersion, byte(Transferring), tagTrail, 0},                                 // an empty trail
		{recordVersion, byte(Transferring), tagDest, 0},                                  // an empty dest
		{recordVersion, byte(Outcome), tagOutcome, 2, 0x80, 0x04},                        // outcome 256
		{recordVersion, byte(Outcome), 200, 3, 'x', 'y', 'z'},                            // an unknown tag
		{recordVersion, byte(Outcome), tagAt, 10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		{recordVersion, byte(Outcome), tagAt, 10, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		bytes.Repeat([]byte{0xff}, 64),
		bytes.Repeat([]byte{0x80}, 64),
	}
	for _, b := range tricky {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, "as given", data)
		checkDecode(t, "with checksum", withCRC(data))
	})
}

// checkDecode asserts what must hold for any input: Decode does not panic,
// fails only with ErrCorrupt or ErrVersion, and what it reads is a record
// whose encoding is canonical — it reads back equal, encodes to the same
// bytes again, and is never longer than the input it came from.
func checkDecode(t *testing.T, what string, data []byte) {
	t.Helper()
	in := append([]byte(nil), data...)
	r, err := Decode(data)
	if !bytes.Equal(in, data) {
		t.Fatalf("%s: Decode modified its input", what)
	}
	if err != nil {
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
			t.Fatalf("%s: Decode(% x): error %v is neither ErrCorrupt nor ErrVersion", what, data, err)
		}
		return
	}
	if r.Kind == 0 || r.Kind >= maxKind {
		t.Fatalf("%s: Decode(% x) accepted kind %d", what, data, r.Kind)
	}
	if r.Trail != nil && len(r.Trail) == 0 {
		t.Fatalf("%s: Decode(% x) returned an empty, non-nil trail", what, data)
	}
	enc := r.Encode(nil)
	if len(enc) > len(data) {
		t.Fatalf("%s: Encode(Decode(% x)) = % x is longer than its input", what, data, enc)
	}
	r2, err := Decode(enc)
	if err != nil {
		t.Fatalf("%s: Decode(Encode(%+v)) = %v", what, r, err)
	}
	if !equalRecord(r2, r) {
		t.Fatalf("%s: Decode(Encode(r)) = %+v, want %+v", what, r2, r)
	}
	if enc2 := r2.Encode(nil); !bytes.Equal(enc2, enc) {
		t.Fatalf("%s: Encode is not stable:\n first % x\nsecond % x", what, enc, enc2)
	}
}
