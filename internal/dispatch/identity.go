package dispatch

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"handoff.dev/handoff/internal/broker"
)

// readEvent reads the CloudEvent of a structured-mode message into m.Event,
// so that identity and delivery both see the event, not its envelope. It
// returns why a message labelled structured is not an event; the message is
// then left as it is (m.Event nil), for the dead-letter queue.
func readEvent(m *broker.Message) error {
	if m.Event != nil || !broker.IsStructured(m.ContentType) {
		return nil
	}
	e, err := broker.ParseStructured(m.Body)
	if err != nil {
		return err
	}
	m.Event = e
	return nil
}

// eventID derives a message's stable identity on its first entry (DESIGN §3):
// its CloudEvents id (a structured event's own, or the binary mode's id
// header), else its broker message id, else its log position, else a hash of
// its content. The last is reported by hashed: two identical messages get one
// id.
func eventID(m *broker.Message) (id string, hashed bool) {
	if m.Event != nil {
		return m.Event.ID, false
	}
	if id := ceID(m.Headers); id != "" {
		return id, false
	}
	if m.MessageID != "" {
		return m.MessageID, false
	}
	if m.Position != "" {
		return m.Position, false
	}
	return contentHash(m), true
}

// ceIDNames are the CloudEvents id header in each protocol binding's
// spelling, in the order they are looked for.
var ceIDNames = [...]string{"ce-id", "ce_id", "cloudEvents:id", "cloudEvents_id"}

// ceID finds the CloudEvents id the same way on every delivery of a message:
// exact spellings first, in a fixed order, then any other casing in sorted
// order. (Map order would make the id depend on the delivery.)
func ceID(h broker.Headers) string {
	for _, k := range ceIDNames {
		if v := h[k]; v != "" {
			return v
		}
	}
	var keys []string
	for k, v := range h {
		if v != "" && isCEID(k) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return ""
	}
	slices.Sort(keys)
	return h[keys[0]]
}

func isCEID(k string) bool {
	for _, name := range ceIDNames {
		if len(k) == len(name) && strings.EqualFold(k, name) {
			return true
		}
	}
	return false
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
