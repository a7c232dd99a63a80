package journal

import (
	"math/bits"
	"slices"
)

// The segments' Bloom filters, looked up for every delivery. One filter a
// segment costs a cache line a segment per lookup, and a journal at its
// default max_size holds some thirty segments, looked up twice a delivery
// (State, and the writer linking the first part): the probes grew with the
// file. So segments of the usual shape share a sliced filter: word i of it
// holds bit i of each of up to sliceSlots filters, one segment a bit, and a
// lookup reads its seven bits once for all of them. A segment of another
// shape (sealed by an older release, or with another sealAt) keeps its own
// filter and is probed alone.

// sliceSlots is how many segments one sliced filter holds.
const sliceSlots = 32

// bloomBitsPerEvent sizes a segment's filter: with seven bits an event in
// blocks of a cache line, about one lookup in 400 of an event a segment does
// not hold passes its filter.
const bloomBitsPerEvent = 14

// sealWords is the length in words of the filter of a segment sealed now:
// one shape for all of them, whatever the events each holds, so that they
// share sliced filters.
func sealWords() int {
	return max(1, (sealAt*bloomBitsPerEvent+511)/512) * bloomBlock
}

// slicedFilter holds the filters of up to sliceSlots segments of one shape,
// each filter words long.
type slicedFilter struct {
	words int
	bits  []uint32 // words*64: bit s of bits[w*64+b] is bit b of word w of slot s's filter
	segs  [sliceSlots]*segment
	live  uint32 // the slots in use
}

func newSlicedFilter(words int) *slicedFilter {
	return &slicedFilter{words: words, bits: make([]uint32, words*64)}
}

// add puts g's filter in a free slot and reports whether there was one.
// The filter now lives here: g's own is let go.
func (f *slicedFilter) add(g *segment) bool {
	if f.live == ^uint32(0) || len(g.bloom) != f.words {
		return false
	}
	s := bits.TrailingZeros32(^f.live)
	bit := uint32(1) << s
	for w, word := range g.bloom {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			f.bits[w*64+b] |= bit
			word &= word - 1
		}
	}
	f.segs[s], f.live = g, f.live|bit
	g.bloom, g.slot = nil, f
	return true
}

// remove takes g's filter out.
func (f *slicedFilter) remove(g *segment) {
	for s, h := range f.segs {
		if h != g {
			continue
		}
		bit := uint32(1) << s
		for i := range f.bits {
			f.bits[i] &^= bit
		}
		f.segs[s], f.live = nil, f.live&^bit
		g.slot = nil
		return
	}
}

// has is the slots whose filter may hold h.
func (f *slicedFilter) has(h uint64) uint32 {
	b, bs := bloomBits(h, f.words)
	m := f.live
	base := f.bits[b*64 : (b+bloomBlock)*64]
	for _, x := range bs {
		m &= base[x]
	}
	return m
}

// addSegment makes g, the newest segment, known to lookups.
func (x *index) addSegment(g *segment) {
	x.segs = append(x.segs, g)
	if len(g.bloom) != sealWords() {
		x.loose = append(x.loose, g)
		return
	}
	for _, f := range x.filters {
		if f.add(g) {
			return
		}
	}
	f := newSlicedFilter(len(g.bloom))
	f.add(g)
	x.filters = append(x.filters, f)
}

// dropSegments forgets the segments ending at the given last numbers.
func (x *index) dropSegments(lasts []uint64) {
	x.segs = slices.DeleteFunc(x.segs, func(g *segment) bool {
		if !slices.Contains(lasts, g.last) {
			return false
		}
		if g.slot != nil {
			g.slot.remove(g)
		}
		return true
	})
	x.loose = slices.DeleteFunc(x.loose, func(g *segment) bool { return slices.Contains(lasts, g.last) })
	x.filters = slices.DeleteFunc(x.filters, func(f *slicedFilter) bool { return f.live == 0 })
}

// mayHold appends the segments whose filter may hold h to segs, newest
// first. The caller holds x.mu.
func (x *index) mayHold(h uint64, segs []*segment) []*segment {
	from := len(segs)
	for _, f := range x.filters {
		for m := f.has(h); m != 0; m &= m - 1 {
			segs = append(segs, f.segs[bits.TrailingZeros32(m)])
		}
	}
	for _, g := range x.loose {
		if bloomHas(g.bloom, h) {
			segs = append(segs, g)
		}
	}
	if len(segs)-from > 1 {
		slices.SortFunc(segs[from:], func(a, b *segment) int {
			switch {
			case a.last > b.last:
				return -1
			case a.last < b.last:
				return 1
			}
			return 0
		})
	}
	return segs
}
