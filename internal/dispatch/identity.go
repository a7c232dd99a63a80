package dispatch

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"handoff.dev/handoff/internal/broker"
)

// eventID derives a message's stable identity on its first entry (DESIGN §3):
// its CloudEvents id, else its broker message id, else its log position, else
// a hash of its content. The last is reported by hashed: two identical
// messages get one id.
func eventID(m *broker.Message) (id string, hashed bool) {
	for k, v := range m.Headers {
		if v != "" && isCEID(k) {
			return v, false
		}
	}
	if m.MessageID != "" {
		return m.MessageID, false
	}
	if m.Position != "" {
		return m.Position, false
	}
	return contentHash(m), true
}

func isCEID(k string) bool {
	if len(k) < 5 {
		return false
	}
	lk := strings.ToLower(k)
	return lk == "ce-id" || lk == "ce_id" || lk == "cloudevents:id" || lk == "cloudevents_id"
}

func contentHash(m *broker.Message) string {
	h := sha256.New()
	h.Write([]byte(m.ContentType))
	h.Write([]byte{0})
	keys := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		if !broker.IsOwned(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write([]byte(m.Headers[k]))
		h.Write([]byte{0})
	}
	h.Write(m.Body)
	return "sha256:" + hex.EncodeToString(h.Sum(nil)[:16])
}
