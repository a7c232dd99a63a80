package deadletter

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

var at = time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)

func approval() Record {
	return Record{
		Version: RecordVersion, Kind: KindTransition, ID: "orders.dlq/7",
		Transition: Approve, State: Approved, Who: "alice", At: at, Why: "amount fixed upstream",
		Nonce:  "n1",
		Repair: &Repair{Body: []byte(`{"amount":10}`), ContentType: "application/json", Note: "amount=invalid → amount=10"},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		rec  Record
	}{
		{name: "approve with repair", rec: approval()},
		{name: "terminate", rec: Record{Version: 1, Kind: KindTransition, ID: "t.g.dlq/2/9", Transition: Terminate, State: Terminated, Who: "bob", At: at, Why: "duplicate order"}},
		{name: "replay", rec: Record{Version: 1, Kind: KindTransition, ID: "t.g.dlq/2/9", Transition: Replay, State: Replaying, Who: "replica-a", At: at, ReplayID: "r1"}},
		{name: "fail-replay", rec: Record{Version: 1, Kind: KindTransition, ID: "t.g.dlq/2/9", Transition: FailReplay, State: FailedReplay, Who: "replica-b", At: at, ReplayID: "r1", Successor: "t.g.dlq/0/44"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.rec.Encode()
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeRecord(b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if !reflect.DeepEqual(got, tt.rec) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, tt.rec)
			}
		})
	}
}

func TestDecodeRecordRefuses(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want error
	}{
		{name: "newer version", in: `{"v":2,"kind":"transition","whatever":1}`, want: ErrVersion},
		{name: "unknown kind", in: `{"v":1,"kind":"replay-heartbeat","run":"r1"}`, want: ErrUnknownKind},
		{name: "not json", in: `{`, want: ErrBadRecord},
		{name: "version zero", in: `{"kind":"transition"}`, want: ErrBadRecord},
		{name: "unknown field", in: `{"v":1,"kind":"transition","id":"q.dlq/1","transition":"terminate","state":"terminated","who":"a","at":"2026-12-01T00:00:00Z","extra":1}`, want: ErrBadRecord},
		{name: "trailing data", in: `{"v":1,"kind":"transition","id":"q.dlq/1","transition":"terminate","state":"terminated","who":"a","at":"2026-12-01T00:00:00Z"} {}`, want: ErrBadRecord},
		{name: "state does not follow", in: `{"v":1,"kind":"transition","id":"q.dlq/1","transition":"terminate","state":"done","who":"a","at":"2026-12-01T00:00:00Z"}`, want: ErrBadRecord},
		{name: "expire is never written", in: `{"v":1,"kind":"transition","id":"q.dlq/1","transition":"expire","state":"expired","who":"a","at":"2026-12-01T00:00:00Z"}`, want: ErrBadRecord},
		{name: "no who", in: `{"v":1,"kind":"transition","id":"q.dlq/1","transition":"terminate","state":"terminated","at":"2026-12-01T00:00:00Z"}`, want: ErrBadRecord},
		{name: "no time", in: `{"v":1,"kind":"transition","id":"q.dlq/1","transition":"terminate","state":"terminated","who":"a"}`, want: ErrBadRecord},
		{name: "bad id", in: `{"v":1,"kind":"transition","id":"q/1","transition":"terminate","state":"terminated","who":"a","at":"2026-12-01T00:00:00Z"}`, want: ErrBadRecord},
		{name: "replay without id", in: `{"v":1,"kind":"transition","id":"q.dlq/1","transition":"replay","state":"replaying","who":"a","at":"2026-12-01T00:00:00Z"}`, want: ErrBadRecord},
		{name: "repair on terminate", in: `{"v":1,"kind":"transition","id":"q.dlq/1","transition":"terminate","state":"terminated","who":"a","at":"2026-12-01T00:00:00Z","repair":{"body":""}}`, want: ErrBadRecord},
		{name: "fail-replay without successor", in: `{"v":1,"kind":"transition","id":"q.dlq/1","transition":"fail-replay","state":"failed-replay","who":"a","at":"2026-12-01T00:00:00Z","replay_id":"r"}`, want: ErrBadRecord},
		{name: "too large", in: `{"v":1,"why":"` + strings.Repeat("x", maxRecordLen) + `"}`, want: ErrBadRecord},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeRecord([]byte(tt.in))
			if !errors.Is(err, tt.want) {
				t.Fatalf("DecodeRecord = %v; want %v", err, tt.want)
			}
		})
	}
}

func TestEncodeChecks(t *testing.T) {
	r := approval()
	r.Who = ""
	if _, err := r.Encode(); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("Encode without who = %v", err)
	}
}
