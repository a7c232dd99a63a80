package report

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	adminv1 "handoff.dev/handoff/api/admin/v1"
)

// ReplayStarted says what a start did, or with a dry run would do.
func ReplayStarted(w io.Writer, r *adminv1.Replay) {
	if r.GetDryRun() {
		fmt.Fprintf(w, "dry run: would replay %s of %s\n", CountOf(len(r.GetIds())), Shown(r.GetSource()))
		for _, id := range r.GetIds() {
			fmt.Fprintf(w, "  %s\n", Shown(id))
		}
		return
	}
	fmt.Fprintf(w, "replay %s started: %s of %s, %s\n", Shown(r.GetId()), CountOf(int(r.GetProgress().GetSelected())), Shown(r.GetSource()), settings(r))
}

// settings are a replay's rate, batch, sample and stop threshold.
func settings(r *adminv1.Replay) string {
	s := fmt.Sprintf("%g/s in batches of %d", r.GetRatePerSecond(), r.GetBatchSize())
	if r.GetSample() > 0 {
		s += fmt.Sprintf(", a sample of %d first", r.GetSample())
	}
	s += fmt.Sprintf(", stop past %g%% failures", r.GetStopFailureRatio()*100)
	if r.GetForce() {
		s += ", forced"
	}
	return s
}

// Progress is the bar's description: the replay, its rate and ETA, or
// why it is paused.
func Progress(r *adminv1.Replay) string {
	p := r.GetProgress()
	s := fmt.Sprintf("replay %s %.1f/s", Shown(r.GetId()), p.GetRate())
	if r.GetPaused() {
		return s + ", paused: " + Shown(r.GetDetail())
	}
	if p.GetEta() != nil && p.GetRemaining() > 0 {
		s += ", ETA " + p.GetEta().AsDuration().Round(time.Second).String()
	}
	return s
}

// ReplaySummary is the last word on a replay: its state, why, and what
// became of its dead letters.
func ReplaySummary(w io.Writer, r *adminv1.Replay) {
	fmt.Fprintf(w, "replay %s %s", Shown(r.GetId()), r.GetState())
	if r.GetDetail() != "" {
		fmt.Fprintf(w, ": %s", Shown(r.GetDetail()))
	}
	fmt.Fprintln(w)
	p := r.GetProgress()
	fmt.Fprintf(w, "  published %d of %d, handled %d, failed %d, skipped %d", p.GetPublished(), p.GetSelected(), p.GetHandled(), p.GetFailed(), p.GetSkipped())
	switch {
	case p.GetRemaining() > 0 && r.GetState() == "running":
		fmt.Fprintf(w, ", remaining %d", p.GetRemaining())
	case p.GetRemaining() > 0:
		// Their state is unchanged: a later run may take them.
		fmt.Fprintf(w, ", %d left unpublished", p.GetRemaining())
	}
	if n := Pending(r); n > 0 {
		fmt.Fprintf(w, "; %d published copies' outcomes not known yet (sidecar replay status %s shows them as they come)", n, Shown(r.GetId()))
	}
	fmt.Fprintln(w)
}

// Pending is how many of a replay's published copies have no outcome yet:
// the app has not answered them, or the answer is not recorded.
func Pending(r *adminv1.Replay) int64 {
	p := r.GetProgress()
	return max(p.GetPublished()-p.GetHandled()-p.GetFailed(), 0)
}

// Replay prints a replay for a reader.
func Replay(w io.Writer, r *adminv1.Replay) {
	field := func(name, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-10s%s\n", name, v)
		}
	}
	field("replay", Shown(r.GetId()))
	field("source", Shown(r.GetSource()))
	state := r.GetState()
	if r.GetPaused() {
		state += ", paused"
	}
	if r.GetDetail() != "" {
		state += ": " + Shown(r.GetDetail())
	}
	field("state", state)
	created := tableTime(r.GetCreatedAt()) + " by " + Shown(r.GetCreatedBy())
	if r.GetWhy() != "" {
		created += ": " + Shown(r.GetWhy())
	}
	field("created", created)
	if r.GetEndedAt() != nil {
		field("ended", tableTime(r.GetEndedAt()))
	}
	if r.GetRunner() != "" {
		field("runner", Shown(r.GetRunner())+", last heartbeat "+tableTime(r.GetHeartbeatAt()))
	}
	field("settings", settings(r))
	p := r.GetProgress()
	prog := fmt.Sprintf("published %d of %d, handled %d, failed %d, skipped %d, remaining %d",
		p.GetPublished(), p.GetSelected(), p.GetHandled(), p.GetFailed(), p.GetSkipped(), p.GetRemaining())
	if p.GetRate() > 0 {
		prog += fmt.Sprintf(", %.1f/s", p.GetRate())
	}
	if w := p.GetWaited().AsDuration(); w > 0 {
		prog += ", waited " + w.Round(time.Second).String()
	}
	if p.GetEta() != nil && p.GetRemaining() > 0 {
		prog += ", ETA " + p.GetEta().AsDuration().Round(time.Second).String()
	}
	field("progress", prog)
}

// Replays prints a list of replays as a table.
func Replays(w io.Writer, l *adminv1.ListReplaysResponse) {
	if len(l.GetReplays()) == 0 {
		fmt.Fprintln(w, "no replays")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSOURCE\tSTATE\tCREATED\tBY\tPUBLISHED\tHANDLED\tFAILED\tSKIPPED")
	for _, r := range l.GetReplays() {
		p := r.GetProgress()
		state := r.GetState()
		if r.GetPaused() {
			state += " (paused)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%d\t%d\t%d\n", Shown(r.GetId()), Shown(r.GetSource()), state, tableTime(r.GetCreatedAt()),
			Shown(r.GetCreatedBy()), p.GetPublished(), p.GetSelected(), p.GetHandled(), p.GetFailed(), p.GetSkipped())
	}
	_ = tw.Flush()
}

// CountOf is "1 dead letter" or "n dead letters".
func CountOf(n int) string {
	if n == 1 {
		return "1 dead letter"
	}
	return fmt.Sprintf("%d dead letters", n)
}
