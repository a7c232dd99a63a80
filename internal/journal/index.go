package journal

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
	bolt "go.etcd.io/bbolt"
)

// The index says where each event's newest part is, without a read of the
// file for an event it does not know: a first delivery costs a look in
// memory. It is in two tiers:
//
//   - the tail: a map from event hash to ref for the parts written since
//     the latest seal, rebuilt at open by reading those parts (at most
//     sealAt of them);
//   - segments: each seal writes the tail's entries, sorted by hash, as one
//     value of the index bucket (under the seal's last sequence number),
//     with a blocked Bloom filter that is kept in memory (10 bits an
//     event), so that an event a segment does not hold costs one cache
//     line, and one it does a binary search in the mapped file.
//
// The newest tier that holds an event has its newest part. The open set,
// the events whose latest hop is received and not settled, is kept in
// memory too and written with each seal, so that a restart knows it from
// the newest segment and the tail alone.

// sealAt is how many events the tail holds before it is sealed.
var sealAt = 1 << 16

// bucketIndex holds the segments.
var bucketIndex = []byte("index")

// eventHash is the index's key for an event: its source and id, not its
// replay, so that every hand-off of an event shares one chain.
func eventHash(k Key) uint64 {
	d := eventDigest(k)
	return d.Sum64()
}

// keyCheck is the check a part names its hand-off by after the first: the
// event's digest, continued with the replay id.
func keyCheck(k Key) uint32 {
	d := eventDigest(k)
	return checkOf(&d, k)
}

// hashes is eventHash and keyCheck of k, from one digest.
func hashes(k Key) (uint64, uint32) {
	d := eventDigest(k)
	return d.Sum64(), checkOf(&d, k)
}

func eventDigest(k Key) xxhash.Digest {
	var d xxhash.Digest
	d.Reset()
	var n [binary.MaxVarintLen64]byte
	_, _ = d.Write(n[:binary.PutUvarint(n[:], uint64(len(k.Source)))])
	_, _ = d.WriteString(k.Source)
	_, _ = d.WriteString(k.EventID)
	return d
}

func checkOf(d *xxhash.Digest, k Key) uint32 {
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(k.ReplayID)
	return uint32(d.Sum64() >> 32)
}

// openEntry is an event with a hand-off open: its newest part, and the hop
// last received.
type openEntry struct {
	at  ref
	hop int
}

type index struct {
	mu   sync.RWMutex
	tail map[uint64]tailEntry
	segs []*segment // oldest first
	// filters holds the filters of the segments of the usual shape
	// (filter.go); the others, loose, keep their own.
	filters []*slicedFilter
	loose   []*segment
	open    map[uint64]openEntry
}

func newIndex() *index {
	return &index{tail: make(map[uint64]tailEntry), open: make(map[uint64]openEntry)}
}

// segment is a sealed part of the index. Its entries are on file; its
// filter is here.
type segment struct {
	last  uint64 // the last sequence number it covers: its key
	n     int
	bloom []uint64      // its filter, when it has one of its own
	slot  *slicedFilter // else the sliced filter that holds it
}

// bloomBlock is a filter's block: one cache line.
const bloomBlock = 8

// newBloom is a filter for a segment being sealed (see sealWords).
func newBloom() []uint64 {
	return make([]uint64, sealWords())
}

// bloomBits are the block and the seven bits of h in it.
func bloomBits(h uint64, words int) (int, [7]uint16) {
	blocks := words / bloomBlock
	b := int((h >> 32) % uint64(blocks))
	var bits [7]uint16
	x := uint32(h)
	for i := range bits {
		bits[i] = uint16(x & 511)
		x = x>>9 | x<<23
		x ^= uint32(h >> 40)
	}
	return b * bloomBlock, bits
}

func bloomAdd(f []uint64, h uint64) {
	b, bits := bloomBits(h, len(f))
	for _, x := range bits {
		f[b+int(x>>6)] |= 1 << (x & 63)
	}
}

func bloomHas(f []uint64, h uint64) bool {
	b, bits := bloomBits(h, len(f))
	for _, x := range bits {
		if f[b+int(x>>6)]&(1<<(x&63)) == 0 {
			return false
		}
	}
	return true
}

// A segment is stored as small values, under its last sequence number, a
// kind, and an id, so that it needs no run of free pages (see valueFits):
//
//	last ‖ segHeader ‖ 0           → version ‖ n (4) ‖ filter words (4) ‖ open (4)
//	last ‖ segFilter ‖ chunk       → filter words, big-endian
//	last ‖ segEntries ‖ first hash → (hash ‖ ref) × up to segChunk, by hash
//	last ‖ segOpen ‖ chunk         → (hash ‖ ref ‖ hop (4)) × up to segChunk
const (
	segmentVersion = 2

	segHeader  = 0
	segFilter  = 1
	segEntries = 2
	segOpen    = 3

	segChunk = 60 // entries a value: under a quarter page
)

type indexEntry struct {
	h uint64
	r ref
}

func segKey(last uint64, kind byte, id uint64) []byte {
	k := binary.BigEndian.AppendUint64(make([]byte, 0, 17), last)
	return binary.BigEndian.AppendUint64(append(k, kind), id)
}

// putSegment writes a segment's values in b.
func putSegment(b *bolt.Bucket, last uint64, entries []indexEntry, bloom []uint64, open map[uint64]openEntry) error {
	hdr := []byte{segmentVersion}
	hdr = binary.BigEndian.AppendUint32(hdr, uint32(len(entries)))
	hdr = binary.BigEndian.AppendUint32(hdr, uint32(len(bloom)))
	hdr = binary.BigEndian.AppendUint32(hdr, uint32(len(open)))
	if err := b.Put(segKey(last, segHeader, 0), hdr); err != nil {
		return err
	}
	for i := 0; i < len(bloom); i += segChunk * 2 {
		var v []byte
		for _, w := range bloom[i:min(i+segChunk*2, len(bloom))] {
			v = binary.BigEndian.AppendUint64(v, w)
		}
		if err := b.Put(segKey(last, segFilter, uint64(i)), v); err != nil {
			return err
		}
	}
	for i := 0; i < len(entries); i += segChunk {
		var v []byte
		for _, e := range entries[i:min(i+segChunk, len(entries))] {
			v = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(v, e.h), uint64(e.r))
		}
		if err := b.Put(segKey(last, segEntries, entries[i].h), v); err != nil {
			return err
		}
	}
	var v []byte
	chunk := uint64(0)
	for h, o := range open {
		v = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(v, h), uint64(o.at))
		v = binary.BigEndian.AppendUint32(v, uint32(o.hop))
		if len(v) >= segChunk*20 {
			if err := b.Put(segKey(last, segOpen, chunk), v); err != nil {
				return err
			}
			v, chunk = nil, chunk+1
		}
	}
	if len(v) > 0 {
		return b.Put(segKey(last, segOpen, chunk), v)
	}
	return nil
}

// readSegment reads the segment whose header is at c (positioned on it):
// its filter, and its open set when open is set.
func readSegment(c *bolt.Cursor, last uint64, open func(h uint64, o openEntry)) (*segment, error) {
	bad := func(what string) error { return fmt.Errorf("%w: index segment %d: %s", ErrCorrupt, last, what) }
	k, v := c.Seek(segKey(last, segHeader, 0))
	if len(k) != 17 || len(v) != 13 || v[0] != segmentVersion {
		return nil, bad("header")
	}
	g := &segment{last: last, n: int(binary.BigEndian.Uint32(v[1:]))}
	words := int(binary.BigEndian.Uint32(v[5:]))
	if words%bloomBlock != 0 || words == 0 {
		return nil, bad("filter size")
	}
	g.bloom = make([]uint64, 0, words)
	for k, v = c.Next(); len(k) == 17 && binary.BigEndian.Uint64(k) == last && k[8] == segFilter; k, v = c.Next() {
		for p := v; len(p) >= 8; p = p[8:] {
			g.bloom = append(g.bloom, binary.BigEndian.Uint64(p))
		}
	}
	if len(g.bloom) != words {
		return nil, bad("filter")
	}
	if open == nil {
		return g, nil
	}
	for k, v = c.Seek(segKey(last, segOpen, 0)); len(k) == 17 && binary.BigEndian.Uint64(k) == last && k[8] == segOpen; k, v = c.Next() {
		if len(v)%20 != 0 {
			return nil, bad("open set")
		}
		for p := v; len(p) >= 20; p = p[20:] {
			open(binary.BigEndian.Uint64(p), openEntry{at: ref(binary.BigEndian.Uint64(p[8:])), hop: int(binary.BigEndian.Uint32(p[16:]))})
		}
	}
	return g, nil
}

// findInSegment is h's ref in the segment ending at last, from the chunk
// of entries that would hold it.
func findInSegment(c *bolt.Cursor, last, h uint64) (ref, bool) {
	want := segKey(last, segEntries, h)
	k, v := c.Seek(want)
	if k == nil || string(k) != string(want) {
		// The chunk holding h starts before it: the one before.
		if k, v = c.Prev(); k == nil {
			return 0, false
		}
	}
	if len(k) != 17 || binary.BigEndian.Uint64(k) != last || k[8] != segEntries {
		return 0, false
	}
	lo, hi := 0, len(v)/16
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if binary.BigEndian.Uint64(v[m*16:]) < h {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(v)/16 && binary.BigEndian.Uint64(v[lo*16:]) == h {
		return ref(binary.BigEndian.Uint64(v[lo*16+8:])), true
	}
	return 0, false
}

// deleteSegments deletes every segment whose last sequence number is below
// cut, and returns their last numbers.
func deleteSegments(b *bolt.Bucket, cut uint64) ([]uint64, error) {
	var gone []uint64
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.First(); k != nil && len(k) == 17 && binary.BigEndian.Uint64(k) < cut; k, _ = c.Next() {
		if last := binary.BigEndian.Uint64(k); len(gone) == 0 || gone[len(gone)-1] != last {
			gone = append(gone, last)
		}
		keys = append(keys, slices.Clone(k))
	}
	// Each by its key, once the walk is done: a cursor's First after each
	// delete would pass over every leaf emptied before it.
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return gone, err
		}
	}
	return gone, nil
}

// lookup returns h's ref in the tail or, when the tail does not hold it,
// the segments whose filter may, newest first.
func (x *index) lookup(h uint64, segs []*segment, tail bool) (ref, bool, []*segment) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if tail {
		if e, ok := x.tail[h]; ok {
			return e.at, true, segs
		}
	}
	return 0, false, x.mayHold(h, segs)
}

// resolve is h's newest part as of tx: the tail's, or the newest segment's
// that holds it; 0 when none does.
func (x *index) resolve(tx *bolt.Tx, h uint64) (ref, error) {
	return x.find(tx, h, true)
}

// resolveSegments is resolve for the writer, which reads the tail itself.
func (x *index) resolveSegments(tx *bolt.Tx, h uint64) (ref, error) {
	return x.find(tx, h, false)
}

func (x *index) find(tx *bolt.Tx, h uint64, tail bool) (ref, error) {
	var buf [8]*segment
	r, ok, segs := x.lookup(h, buf[:0], tail)
	if ok || len(segs) == 0 {
		return r, nil
	}
	c := tx.Bucket(bucketIndex).Cursor()
	for _, s := range segs {
		if r, ok := findInSegment(c, s.last, h); ok {
			return r, nil
		}
	}
	return 0, nil
}

// knows reports whether the index may hold h, from memory alone: false
// means the journal has no history of the event.
func (x *index) knows(h uint64) bool {
	var buf [8]*segment
	_, ok, segs := x.lookup(h, buf[:0], true)
	return ok || len(segs) > 0
}
