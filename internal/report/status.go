package report

import (
	"fmt"
	"io"
	"strings"
	"time"

	adminv1 "handoff.dev/handoff/api/admin/v1"
)

// Event prints an event's timelines as `sidecar journal events` does.
func Event(w io.Writer, e *adminv1.Event) {
	for _, h := range e.GetHandoffs() {
		key := e.GetSource() + "/" + e.GetEventId()
		if h.GetReplayId() != "" {
			key += "@" + h.GetReplayId()
		}
		fmt.Fprintln(w, key)
		for _, s := range h.GetSteps() {
			fmt.Fprintf(w, "  %s  %s\n", s.GetAt().AsTime().UTC().Format(stampLayout), s.GetText())
		}
	}
}

// Status prints a status for a reader; now dates its ages.
func Status(w io.Writer, s *adminv1.Status, now time.Time) {
	if s.GetStartedAt() != nil {
		at := s.GetStartedAt().AsTime()
		fmt.Fprintf(w, "started   %s (up %s)\n", at.UTC().Format(time.RFC3339), now.Sub(at).Round(time.Second))
	}
	if s.GetNotReady() != "" {
		fmt.Fprintf(w, "ready     no: %s\n", s.GetNotReady())
	} else {
		fmt.Fprintln(w, "ready     yes")
	}
	c := s.GetCalls()
	fmt.Fprintf(w, "calls     %d in flight, limit %d of %d, %d queued\n", c.GetInFlight(), c.GetLimit(), c.GetMax(), c.GetQueued())
	if c.GetFreshIntakePaused() {
		fmt.Fprintln(w, "          fresh intake paused: the retry budget is spent and first attempts keep failing")
	}
	if c.GetAppUnreachable() {
		fmt.Fprintln(w, "          app unreachable: every call waits for it")
	}
	if u := c.GetOverloadUntil(); u != nil {
		fmt.Fprintf(w, "          the app asked to slow down: calls wait until %s\n", u.AsTime().UTC().Format(time.RFC3339))
	}
	b := s.GetBudget()
	fmt.Fprintf(w, "budget    %.2f tokens, %d re-attempts denied\n", b.GetTokens(), b.GetDenied())
	j := s.GetJournal()
	fmt.Fprintf(w, "journal   %s, %s, %d open, commit p50 %s max %s\n", j.GetPath(), ByteSize(j.GetSizeBytes()), j.GetOpen(),
		j.GetCommitP50().AsDuration().Round(time.Microsecond), j.GetCommitMax().AsDuration().Round(time.Microsecond))
	for _, src := range s.GetSources() {
		fmt.Fprintf(w, "\nsource %s (%s %s)\n", src.GetName(), src.GetBroker(), src.GetFrom())
		line := src.GetState()
		if src.GetReason() != "" {
			line += ": " + src.GetReason() // says so when not connected
		}
		if src.GetConnected() {
			line = "connected, " + line
		}
		fmt.Fprintf(w, "  %s\n", line)
		if g := src.GetShareGroup(); g != nil {
			from := map[string]string{"group": "the group's config", "brokers": "the brokers' defaults"}[g.GetReadFrom()]
			if from == "" {
				from = "Kafka's defaults"
			}
			fmt.Fprintf(w, "  share group %s: archived after %d deliveries, lock %s (%s); retries read by %s\n",
				g.GetName(), g.GetDeliveryCountLimit(), g.GetLockDuration().AsDuration(), from, g.GetRetryGroup())
		}
		fmt.Fprintf(w, "  %d in flight", src.GetInFlight())
		if a := src.GetOldestUnsettledAge(); a != nil && src.GetInFlight() > 0 {
			fmt.Fprintf(w, ", oldest %s", a.AsDuration().Round(time.Millisecond))
		}
		fmt.Fprintln(w)
		for _, t := range src.GetRetryTiers() {
			waiting := "waiting unknown"
			if t.GetKnown() {
				waiting = fmt.Sprintf("%d waiting", t.GetWaiting())
			}
			fmt.Fprintf(w, "  retry %s (%s): %s\n", t.GetName(), t.GetDelay().AsDuration(), waiting)
		}
		if b := src.GetBacklog(); b != nil {
			drain := "not converging: arrivals outpace completions"
			switch {
			case b.GetMessages() == 0:
				drain = "nothing waiting"
			case b.GetConverging():
				drain = "drains in " + b.GetDrain().AsDuration().Round(time.Second).String()
			}
			fmt.Fprintf(w, "  backlog %d, arrivals %.1f/s, completions %.1f/s: %s\n",
				b.GetMessages(), b.GetArrivalRate(), b.GetCompletionRate(), drain)
		}
		if c := src.GetDeadLetters(); c != nil {
			fmt.Fprintf(w, "  dead letters %s\n", strings.TrimPrefix(countsLine(c), c.GetSource()+": "))
		}
	}
}

// ByteSize is n bytes for a reader.
func ByteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
