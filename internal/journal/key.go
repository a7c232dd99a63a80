package journal

import (
	"encoding/binary"
	"fmt"
)

// Key identifies one hand-off: an event from one source, in one replay. A
// replay of an event is a new hand-off and is never suppressed by the earlier
// one.
type Key struct {
	Source   string
	EventID  string
	ReplayID string
}

func (k Key) String() string {
	if k.ReplayID == "" {
		return k.Source + "/" + k.EventID
	}
	return k.Source + "/" + k.EventID + "@" + k.ReplayID
}

// encode writes k as length-prefixed parts, so that no event id, however
// odd, can make one key a prefix of another's steps.
func (k Key) encode(dst []byte) []byte {
	for _, s := range []string{k.Source, k.EventID, k.ReplayID} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	return dst
}

// decodeKey reads a key written by encode and returns the rest of b.
func decodeKey(b []byte) (Key, []byte, error) {
	var parts [3]string
	for i := range parts {
		var ok bool
		if parts[i], b, ok = readString(b); !ok {
			return Key{}, nil, fmt.Errorf("%w: key", ErrCorrupt)
		}
	}
	return Key{Source: parts[0], EventID: parts[1], ReplayID: parts[2]}, b, nil
}
