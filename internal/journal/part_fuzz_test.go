package journal

import (
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"
)

// FuzzPart feeds the log's part decoders arbitrary bodies, as they come and
// framed with a valid length and checksum (random bytes almost never carry
// a valid CRC-32C), and checks that they never panic, that a link never
// leads forward, and that what decodes encodes back to the same records.
func FuzzPart(f *testing.F) {
	base := at(0).UnixNano()
	k := Key{Source: "orders", EventID: "0f35-8b87", ReplayID: "r-1"}
	stories := [][]Record{
		storySettledSuccess(at(0)),
		storyTransferring(at(time.Second)),
		{fullRecord()},
		{{Kind: Received}},
	}
	for i, recs := range stories {
		v := appendValueHeader(nil, at(0))
		flags := byte(flagKey)
		if i%2 == 1 {
			flags = flagCopy
		}
		v = appendPart(v, 7, flags, k, keyCheck(k), makeRef(5, valueHeader), recs, base)
		body, _, err := readPart(v, valueHeader)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append([]byte(nil), body...))
	}
	for _, b := range [][]byte{nil, {}, {flagKey}, {0, 1, 2, 3, 4}, {flagKey, 0x80}, {0, 0, 0, 0, 0, 0xff, 0xff}} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		const seq = 7
		// Framed as the writer frames it: the body's length and checksum.
		v := appendValueHeader(nil, at(0))
		v = binary.AppendUvarint(v, uint64(len(body)))
		v = append(v, body...)
		v = binary.LittleEndian.AppendUint32(v, crc32.Checksum(body, castagnoli))
		got, next, err := readPart(v, valueHeader)
		if err != nil || next != len(v) {
			t.Fatalf("readPart of a framed body = %v, next %d of %d", err, next, len(v))
		}
		head, p, err := readHead(got, seq)
		if err != nil {
			return
		}
		if head.prev != 0 && head.prev.seq() > seq {
			t.Fatalf("link to %d from a part at %d", head.prev.seq(), seq)
		}
		recs, err := readRecords(p, base, nil)
		if err != nil {
			return
		}
		// Records that decode encode back to what decodes the same.
		again := appendPart(appendValueHeader(nil, at(0)), seq, head.flags, head.key, head.check, head.prev, recs, base)
		body2, _, err := readPart(again, valueHeader)
		if err != nil {
			t.Fatal(err)
		}
		head2, p2, err := readHead(body2, seq)
		if err != nil {
			t.Fatalf("re-encoded head: %v", err)
		}
		recs2, err := readRecords(p2, base, nil)
		if err != nil || len(recs2) != len(recs) || head2.prev != head.prev {
			t.Fatalf("re-encoded: %d records (%v), link %v; want %d, %v", len(recs2), err, head2.prev, len(recs), head.prev)
		}
		for i := range recs {
			if !equalRecord(recs[i], recs2[i]) {
				t.Fatalf("record %d: %+v, then %+v", i, recs[i], recs2[i])
			}
		}
		// Unframed, as a damaged value holds it: an error, never a panic.
		_, _, _ = readPart(body, valueHeader)
	})
}
