package dispatch

import (
	"context"

	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/journal"
)

// maxReplayHeader bounds each header a replayed copy is known by: they
// become a journal key and ledger fields, and a producer can write them.
const maxReplayHeader = 256

// readReplay starts the trail of a replayed copy — a dead letter the
// dead-letter manager republished to its source — from the headers it was
// republished with: the event id it keeps, its replay id and the dead letter
// it replays, so that its history is the replay's own and whoever handles
// it can tell the letter's ledger (Options.Replayed). Everything else starts
// fresh, as on any first entry. A message without all three is an ordinary
// one (a dead letter moved back by hand carries an event id, nothing more);
// it reports whether the message is a replayed copy.
//
// A producer could write these headers too: what it gains is a journal key
// of its choosing under a replay id of its own, and a report that the
// dead-letter ledger checks against the replays it holds.
func (h *handoff) readReplay() bool {
	hs := h.msg.Headers
	if len(hs) < 3 {
		// Too few headers to hold the three: most messages, at no look-up.
		return false
	}
	id, replay, of := hs[broker.HeaderEventID], hs[broker.HeaderReplayID], hs[broker.HeaderReplayOf]
	if id == "" || replay == "" || of == "" {
		return false
	}
	if len(id) > maxReplayHeader || len(replay) > maxReplayHeader || len(of) > maxReplayHeader {
		h.logger().Warn("replay headers longer than allowed; handling the message as an ordinary one",
			"max_bytes", maxReplayHeader, "event_id_bytes", len(id), "replay_id_bytes", len(replay), "replay_of_bytes", len(of))
		return false
	}
	h.trail.EventID, h.trail.ReplayID, h.trail.ReplayOf = id, replay, of
	h.key = journal.Key{Source: h.r.Name, EventID: id, ReplayID: replay}
	return true
}

// reportReplayed tells Options.Replayed that the app handled this replayed
// copy, before its ack: the outcome is recorded before the broker forgets
// the copy.
func (h *handoff) reportReplayed(ctx context.Context) {
	if f := h.e.o.Replayed; f != nil && h.trail.ReplayOf != "" {
		f(ctx, h.r.Name, h.trail)
	}
}
