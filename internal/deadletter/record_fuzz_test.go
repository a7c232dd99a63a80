package deadletter

import (
	"errors"
	"reflect"
	"testing"
)

// FuzzLedgerRecord feeds DecodeRecord arbitrary bytes: it must never panic,
// must fail only with its sentinels, and what it accepts must encode and
// decode back to the same record.
func FuzzLedgerRecord(f *testing.F) {
	good := approval()
	b, err := good.Encode()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	for _, s := range []string{
		`{"v":1,"kind":"transition","id":"t.g.dlq/2/9","transition":"fail-replay","state":"failed-replay","who":"r","at":"2026-12-01T00:00:00Z","replay_id":"r1","successor":"t.g.dlq/0/4"}`,
		`{"v":1,"kind":"transition","id":"q.dlq/1","transition":"terminate","state":"terminated","who":"a","at":"2026-12-01T00:00:00+02:00"}`,
		`{"v":2}`, `{"v":1,"kind":"x"}`, `null`, `[]`, `{"v":1e400}`, `{"v":1,"kind":"transition","repair":{"body":"!!"}}`,
		"{\"v\":1,\"kind\":\"transition\",\"id\":\"q.dlq/1\\u0000\"}", `{"v":1,"v":2,"kind":"transition"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := DecodeRecord(in)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrUnknownKind) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		out, err := r.Encode()
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", in, err)
		}
		back, err := DecodeRecord(out)
		if err != nil {
			t.Fatalf("cannot decode own encoding %s: %v", out, err)
		}
		// Times compare by instant: JSON keeps the zone offset, not the
		// *time.Location.
		if !back.At.Equal(r.At) {
			t.Fatalf("time changed: %v → %v", r.At, back.At)
		}
		back.At = r.At
		if !reflect.DeepEqual(back, r) {
			t.Fatalf("round trip changed the record:\n%+v\n%+v", r, back)
		}
	})
}
