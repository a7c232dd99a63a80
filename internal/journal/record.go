package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"time"
)

// Kind is the state change a record writes down.
type Kind uint8

const (
	// Received: a delivery of the event was taken (Hop).
	Received Kind = iota + 1
	// Attempt: attempt Attempt started.
	Attempt
	// Outcome: attempt Attempt ended (Outcome, Status, Latency, Detail).
	Outcome
	// Transferring: a copy (hop Hop) is about to be published to Dest, with
	// the handoff-* headers Trail. Written durably before the publish.
	Transferring
	// Transferred: the broker confirmed the copy of hop Hop.
	Transferred
	// Settled: the delivery of hop Hop was acked (Detail says why).
	Settled
	// Released: the delivery of hop Hop was handed back unsettled.
	Released
	// Renewed: a new publish of an event whose earlier hand-off the journal
	// holds (not a redelivery of it): its history starts again from here.
	Renewed
	maxKind
)

// AttemptAlone is the detail of an ATTEMPT record whose call was made alone,
// with no other call of the engine in flight: if the process stops during
// it, the message's own call is the likeliest cause.
const AttemptAlone = "alone"

var kindNames = [...]string{
	Received: "received", Attempt: "attempt", Outcome: "outcome", Transferring: "transferring",
	Transferred: "transferred", Settled: "settled", Released: "released", Renewed: "renewed",
}

func (k Kind) String() string {
	if k > 0 && k < maxKind {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Record is one state change of a hand-off.
type Record struct {
	Kind    Kind
	At      time.Time
	Hop     int
	Attempt int
	// Outcome is the budget.Outcome of an attempt, as its number.
	Outcome uint8
	Status  int
	Latency time.Duration
	// Dest names a copy's destination ("retry.1s", "dlq").
	Dest   string
	Detail string
	// Trail is a copy's handoff-* headers, kept so an unconfirmed copy can
	// be published again exactly.
	Trail map[string]string
	// Position is where a received message sits in its log (Kafka), so a
	// redelivery of the same record can be told from a new publish.
	Position string
}

// recordVersion is the encoding version. A decoder refuses later versions
// rather than misread them; within a version, unknown fields are skipped.
const recordVersion = 1

// Field tags of the encoding.
const (
	tagAt = iota + 1
	tagHop
	tagAttempt
	tagOutcome
	tagStatus
	tagLatency
	tagDest
	tagDetail
	tagTrail
	tagPosition
)

// Errors of decoding.
var (
	// ErrCorrupt is returned when a record's checksum or structure is wrong.
	ErrCorrupt = errors.New("journal: corrupt record")
	// ErrVersion is returned for a record written by a newer encoding.
	ErrVersion = errors.New("journal: record from a newer version")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encode appends the encoding of r to dst: version, kind, tagged fields (zero
// fields left out), and a CRC-32C of all of it.
func (r *Record) Encode(dst []byte) []byte {
	start := len(dst)
	dst = append(dst, recordVersion, byte(r.Kind))
	field := func(tag byte, v []byte) {
		dst = append(dst, tag)
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	var buf [binary.MaxVarintLen64]byte
	varint := func(tag byte, v int64) {
		if v != 0 {
			field(tag, buf[:binary.PutVarint(buf[:], v)])
		}
	}
	if !r.At.IsZero() {
		field(tagAt, buf[:binary.PutVarint(buf[:], r.At.UnixNano())]) // even the epoch itself
	}
	varint(tagHop, int64(r.Hop))
	varint(tagAttempt, int64(r.Attempt))
	varint(tagOutcome, int64(r.Outcome))
	varint(tagStatus, int64(r.Status))
	varint(tagLatency, int64(r.Latency))
	if r.Dest != "" {
		field(tagDest, []byte(r.Dest))
	}
	if r.Detail != "" {
		field(tagDetail, []byte(r.Detail))
	}
	if r.Position != "" {
		field(tagPosition, []byte(r.Position))
	}
	if len(r.Trail) > 0 {
		keys := make([]string, 0, len(r.Trail))
		for k := range r.Trail {
			keys = append(keys, k)
		}
		slices.Sort(keys) // one encoding per record
		var t []byte
		for _, k := range keys {
			t = binary.AppendUvarint(t, uint64(len(k)))
			t = append(t, k...)
			t = binary.AppendUvarint(t, uint64(len(r.Trail[k])))
			t = append(t, r.Trail[k]...)
		}
		field(tagTrail, t)
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// size is an upper bound of the encoding's length, so Encode appends to a
// buffer allocated once.
func (r *Record) size() int {
	n := 2 + 4 + 6*(2+binary.MaxVarintLen64) + 3*(1+binary.MaxVarintLen64) + len(r.Dest) + len(r.Detail) + len(r.Position)
	if len(r.Trail) > 0 {
		n += 1 + binary.MaxVarintLen64
		for k, v := range r.Trail {
			n += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	return n
}

// Decode reads one encoded record. It never panics: anything it cannot read
// is ErrCorrupt or ErrVersion.
func Decode(b []byte) (Record, error) {
	var r Record
	if len(b) < 6 {
		return r, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return r, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	if body[0] != recordVersion {
		if body[0] > recordVersion {
			return r, fmt.Errorf("%w: version %d", ErrVersion, body[0])
		}
		return r, fmt.Errorf("%w: version %d", ErrCorrupt, body[0])
	}
	r.Kind = Kind(body[1])
	if r.Kind == 0 || r.Kind >= maxKind {
		return r, fmt.Errorf("%w: kind %d", ErrCorrupt, body[1])
	}
	p := body[2:]
	for len(p) > 0 {
		tag := p[0]
		n, w := binary.Uvarint(p[1:])
		if w <= 0 || n > uint64(len(p)-1-w) {
			return r, fmt.Errorf("%w: field %d length", ErrCorrupt, tag)
		}
		v := p[1+w : 1+w+int(n)]
		p = p[1+w+int(n):]
		if err := r.setField(tag, v); err != nil {
			return r, err
		}
	}
	return r, nil
}

func (r *Record) setField(tag byte, v []byte) error {
	num := func() (int64, error) {
		x, w := binary.Varint(v)
		if w <= 0 || w != len(v) {
			return 0, fmt.Errorf("%w: field %d value", ErrCorrupt, tag)
		}
		return x, nil
	}
	var x int64
	var err error
	switch tag {
	case tagAt, tagHop, tagAttempt, tagOutcome, tagStatus, tagLatency:
		if x, err = num(); err != nil {
			return err
		}
	}
	switch tag {
	case tagAt:
		r.At = time.Unix(0, x)
	case tagHop:
		r.Hop = int(x)
	case tagAttempt:
		r.Attempt = int(x)
	case tagOutcome:
		if x < 0 || x > 255 {
			return fmt.Errorf("%w: outcome %d", ErrCorrupt, x)
		}
		r.Outcome = uint8(x)
	case tagStatus:
		r.Status = int(x)
	case tagLatency:
		r.Latency = time.Duration(x)
	case tagDest:
		r.Dest = string(v)
	case tagDetail:
		r.Detail = string(v)
	case tagPosition:
		r.Position = string(v)
	case tagTrail:
		t := map[string]string{}
		for len(v) > 0 {
			var k, val string
			var ok bool
			if k, v, ok = readString(v); !ok {
				return fmt.Errorf("%w: trail key", ErrCorrupt)
			}
			if val, v, ok = readString(v); !ok {
				return fmt.Errorf("%w: trail value", ErrCorrupt)
			}
			t[k] = val
		}
		if len(t) > 0 {
			r.Trail = t
		}
	default:
		// A field from a later revision of this version: skip it.
	}
	return nil
}

func readString(p []byte) (string, []byte, bool) {
	n, w := binary.Uvarint(p)
	if w <= 0 || n > uint64(len(p)-w) {
		return "", nil, false
	}
	return string(p[w : w+int(n)]), p[w+int(n):], true
}
