package journal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"time"
)

// The log's encoding. The log bucket holds one value per group commit
// (a long commit is cut into several), under an increasing sequence number:
//
//	value = version ‖ base time ‖ newest time ‖ part…
//	part  = uvarint(len body) ‖ body ‖ CRC-32C(body) (4 bytes, little-endian)
//	body  = flags ‖ key or key check ‖ prev ‖ uvarint(n) ‖ record…
//
// A record without a time is written at the base time: the commit's.
//
// A part is one hand-off's records of that commit. It names its hand-off
// with the whole key the first time (flagKey), and with a CRC-32C of the
// encoded key after that, and it links to the previous part of the same
// event (prev: 0, or uvarint(seq distance + 1) ‖ uvarint(offset)): the
// parts of an event, in every replay, are one chain that the index in
// memory enters at its newest part. A part flagged flagCopy holds the
// whole history of its hand-off up to it: it was written again at the end
// of the log so that the range that held its older parts could be dropped.
//
// A record is its kind, a uvarint mask of the fields present, and those
// fields in mask order: times as signed nanoseconds from the value's base
// time (the commit's clock; Unix ns, 8 bytes big-endian, like the newest
// record's time that follows it, which retention goes by), numbers as varints, strings and the trail length-prefixed.

// logVersion is the version byte of a log value.
const logVersion = 1

// Part flags.
const (
	flagKey  = 1 << 0 // the whole key follows, not its check
	flagCopy = 1 << 1 // the hand-off's whole history up to here
)

// Record fields, in mask order (the common ones first: they fit a byte).
const (
	fAt = 1 << iota
	fAttempt
	fOutcome
	fStatus
	fLatency
	fHop
	fDetail
	fPosition
	fDest
	fTrail
)

// valueHeader is the length of a value's version and times.
const valueHeader = 17

// ref is where a part sits: its value's sequence number and its offset in
// the value. Refs grow in write order.
type ref uint64

const offsetBits = 24

// maxValue bounds a value, so that every offset fits a ref.
const maxValue = 1<<offsetBits - 1

func makeRef(seq uint64, off int) ref { return ref(seq<<offsetBits | uint64(off)) }
func (r ref) seq() uint64             { return uint64(r) >> offsetBits }
func (r ref) off() int                { return int(uint64(r) & (1<<offsetBits - 1)) }

// appendValueHeader starts a value; setNewest completes its header.
func appendValueHeader(dst []byte, base time.Time) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(append(dst, logVersion), uint64(base.UnixNano())), 0)
}

func setNewest(v []byte, newest int64) { binary.BigEndian.PutUint64(v[9:], uint64(newest)) }

// valueNewest is the time of the newest record in v.
func valueNewest(v []byte) int64 { return int64(binary.BigEndian.Uint64(v[9:valueHeader])) }

// valueBase reads a value's header.
func valueBase(v []byte) (int64, error) {
	if len(v) < valueHeader {
		return 0, fmt.Errorf("%w: log value of %d bytes", ErrCorrupt, len(v))
	}
	if v[0] != logVersion {
		if v[0] > logVersion {
			return 0, fmt.Errorf("%w: log value version %d", ErrVersion, v[0])
		}
		return 0, fmt.Errorf("%w: log value version %d", ErrCorrupt, v[0])
	}
	return int64(binary.BigEndian.Uint64(v[1:9])), nil
}

// partHead is a part's body before its records.
type partHead struct {
	flags byte
	key   Key    // with flagKey
	check uint32 // without it
	prev  ref    // 0: none
}

// names reports whether the part belongs to hand-off k, whose check is c.
func (p *partHead) names(k Key, c uint32) bool {
	if p.flags&flagKey != 0 {
		return p.key == k
	}
	return p.check == c
}

// appendPart appends the part of hand-off k at seq, linked to prev, holding
// recs, to value (whose base time is base).
func appendPart(value []byte, seq uint64, flags byte, k Key, check uint32, prev ref, recs []Record, base int64) []byte {
	start := len(value)
	// The body's length goes first; reserve the most it can take and move
	// the body down if it took less.
	value = append(value, 0, 0, 0, 0, 0)
	body := len(value)
	value = append(value, flags)
	if flags&flagKey != 0 {
		value = k.encode(value)
	} else {
		value = binary.LittleEndian.AppendUint32(value, check)
	}
	if prev == 0 {
		value = append(value, 0)
	} else {
		value = binary.AppendUvarint(value, seq-prev.seq()+1)
		value = binary.AppendUvarint(value, uint64(prev.off()))
	}
	value = binary.AppendUvarint(value, uint64(len(recs)))
	for i := range recs {
		value = appendRecord(value, &recs[i], base)
	}
	n := len(value) - body
	var lb [binary.MaxVarintLen64]byte
	w := binary.PutUvarint(lb[:], uint64(n))
	copy(value[start:], lb[:w])
	if w < 5 {
		copy(value[start+w:], value[body:])
		value = value[:start+w+n]
	}
	return binary.LittleEndian.AppendUint32(value, crc32.Checksum(value[start+w:start+w+n], castagnoli))
}

// readPart returns the body of the part at off in value and where the next
// part starts. A part that fails its checksum is returned with the error
// (and a nil body when even its length is wrong).
func readPart(value []byte, off int) (body []byte, next int, err error) {
	if off < valueHeader || off >= len(value) {
		return nil, 0, fmt.Errorf("%w: part at %d of a %d-byte value", ErrCorrupt, off, len(value))
	}
	n, w := binary.Uvarint(value[off:])
	if w <= 0 || n > uint64(len(value)-off-w-4) {
		return nil, 0, fmt.Errorf("%w: part length", ErrCorrupt)
	}
	body = value[off+w : off+w+int(n)]
	next = off + w + int(n) + 4
	sum := binary.LittleEndian.Uint32(value[off+w+int(n):])
	if crc32.Checksum(body, castagnoli) != sum {
		// The body and where the next part starts, for an operator's
		// view: what it says may be wrong.
		return body, next, fmt.Errorf("%w: part checksum mismatch", ErrCorrupt)
	}
	return body, next, nil
}

// partsOf calls fn with each part of value v in order: its offset, its
// body, and the error reading it. A part that fails its checksum comes with
// its body; one whose length is wrong ends the value and comes with a nil
// body. fn returns whether to go on.
func partsOf(v []byte, fn func(off int, body []byte, err error) bool) {
	for off := valueHeader; off < len(v); {
		body, next, err := readPart(v, off)
		if !fn(off, body, err) || body == nil {
			return
		}
		off = next
	}
}

// readHead reads a part's head from body, at seq, and returns the records'
// encoding that follows.
func readHead(body []byte, seq uint64) (partHead, []byte, error) {
	var h partHead
	if len(body) < 1 {
		return h, nil, fmt.Errorf("%w: empty part", ErrCorrupt)
	}
	h.flags, body = body[0], body[1:]
	if h.flags&flagKey != 0 {
		var err error
		if h.key, body, err = decodeKey(body); err != nil {
			return h, nil, err
		}
	} else {
		if len(body) < 4 {
			return h, nil, fmt.Errorf("%w: part key check", ErrCorrupt)
		}
		h.check, body = binary.LittleEndian.Uint32(body), body[4:]
	}
	d, w := binary.Uvarint(body)
	if w <= 0 {
		return h, nil, fmt.Errorf("%w: part link", ErrCorrupt)
	}
	body = body[w:]
	if d > 0 {
		off, w := binary.Uvarint(body)
		if w <= 0 || d-1 > seq || off > maxValue {
			return h, nil, fmt.Errorf("%w: part link", ErrCorrupt)
		}
		body = body[w:]
		h.prev = makeRef(seq-(d-1), int(off))
	}
	return h, body, nil
}

// readRecords decodes the records of a part (what readHead left).
func readRecords(p []byte, base int64, dst []Record) ([]Record, error) {
	n, w := binary.Uvarint(p)
	if w <= 0 || n > uint64(len(p)) {
		return dst, fmt.Errorf("%w: record count", ErrCorrupt)
	}
	p = p[w:]
	for range n {
		var r Record
		var err error
		if r, p, err = readRecord(p, base); err != nil {
			return dst, err
		}
		dst = append(dst, r)
	}
	if len(p) != 0 {
		return dst, fmt.Errorf("%w: %d bytes after the records", ErrCorrupt, len(p))
	}
	return dst, nil
}

func appendRecord(dst []byte, r *Record, base int64) []byte {
	var mask uint64
	set := func(bit uint64, on bool) {
		if on {
			mask |= bit
		}
	}
	set(fAt, true)
	set(fAttempt, r.Attempt != 0)
	set(fOutcome, r.Outcome != 0)
	set(fStatus, r.Status != 0)
	set(fLatency, r.Latency != 0)
	set(fHop, r.Hop != 0)
	set(fDetail, r.Detail != "")
	set(fPosition, r.Position != "")
	set(fDest, r.Dest != "")
	set(fTrail, len(r.Trail) > 0)
	dst = binary.AppendUvarint(append(dst, byte(r.Kind)), mask)
	if !r.At.IsZero() {
		dst = binary.AppendVarint(dst, r.At.UnixNano()-base)
	} else {
		dst = append(dst, 0)
	}
	if mask&fAttempt != 0 {
		dst = binary.AppendVarint(dst, int64(r.Attempt))
	}
	if mask&fOutcome != 0 {
		dst = append(dst, r.Outcome)
	}
	if mask&fStatus != 0 {
		dst = binary.AppendVarint(dst, int64(r.Status))
	}
	if mask&fLatency != 0 {
		dst = binary.AppendVarint(dst, int64(r.Latency))
	}
	if mask&fHop != 0 {
		dst = binary.AppendVarint(dst, int64(r.Hop))
	}
	if mask&fDetail != 0 {
		dst = appendString(dst, r.Detail)
	}
	if mask&fPosition != 0 {
		dst = appendString(dst, r.Position)
	}
	if mask&fDest != 0 {
		dst = appendString(dst, r.Dest)
	}
	if mask&fTrail != 0 {
		keys := make([]string, 0, len(r.Trail))
		for k := range r.Trail {
			keys = append(keys, k)
		}
		slices.Sort(keys) // one encoding per record
		dst = binary.AppendUvarint(dst, uint64(len(keys)))
		for _, k := range keys {
			dst = appendString(appendString(dst, k), r.Trail[k])
		}
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
}

// readRecord decodes one record. It never panics.
func readRecord(p []byte, base int64) (Record, []byte, error) {
	var r Record
	if len(p) < 2 {
		return r, nil, fmt.Errorf("%w: record", ErrCorrupt)
	}
	r.Kind = Kind(p[0])
	if r.Kind == 0 || r.Kind >= maxKind {
		return r, nil, fmt.Errorf("%w: kind %d", ErrCorrupt, p[0])
	}
	mask, w := binary.Uvarint(p[1:])
	if w <= 0 || mask >= fTrail<<1 {
		return r, nil, fmt.Errorf("%w: record fields", ErrCorrupt)
	}
	p = p[1+w:]
	bad := false
	num := func() int64 {
		x, w := binary.Varint(p)
		if w <= 0 {
			bad = true
			return 0
		}
		p = p[w:]
		return x
	}
	str := func() string {
		s, rest, ok := readString(p)
		if !ok {
			bad = true
			return ""
		}
		p = rest
		return s
	}
	if mask&fAt != 0 {
		r.At = time.Unix(0, base+num())
	} else {
		r.At = time.Unix(0, base) // as the writer writes a record without a time
	}
	if mask&fAttempt != 0 {
		r.Attempt = int(num())
	}
	if mask&fOutcome != 0 {
		if len(p) == 0 {
			return r, nil, fmt.Errorf("%w: outcome", ErrCorrupt)
		}
		r.Outcome, p = p[0], p[1:]
	}
	if mask&fStatus != 0 {
		r.Status = int(num())
	}
	if mask&fLatency != 0 {
		r.Latency = time.Duration(num())
	}
	if mask&fHop != 0 {
		r.Hop = int(num())
	}
	if mask&fDetail != 0 {
		r.Detail = str()
	}
	if mask&fPosition != 0 {
		r.Position = str()
	}
	if mask&fDest != 0 {
		r.Dest = str()
	}
	if mask&fTrail != 0 && !bad {
		n, w := binary.Uvarint(p)
		if w <= 0 || n > uint64(len(p)) {
			return r, nil, fmt.Errorf("%w: trail", ErrCorrupt)
		}
		p = p[w:]
		t := make(map[string]string, n)
		for range n {
			k := str()
			v := str()
			if bad {
				break
			}
			t[k] = v
		}
		if len(t) > 0 {
			r.Trail = t
		}
	}
	if bad {
		return r, nil, fmt.Errorf("%w: record field", ErrCorrupt)
	}
	return r, p, nil
}
