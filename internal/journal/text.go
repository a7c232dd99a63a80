package journal

import (
	"fmt"
	"strings"
	"time"

	"handoff.dev/handoff/internal/budget"
)

// Text is the line an operator reads for r in a timeline (`sidecar journal
// events`, the admin API's event timeline): the same words wherever a
// timeline is shown.
func (r Record) Text() string {
	switch r.Kind {
	case Received:
		return fmt.Sprintf("received     hop %d", r.Hop)
	case Attempt:
		return fmt.Sprintf("attempt %-4d started", r.Attempt)
	case Outcome:
		// The outcome, then how long the app took to answer: not a wait.
		s := fmt.Sprintf("attempt %-4d %s, answered in %s", r.Attempt, budget.Outcome(r.Outcome), r.Latency.Round(time.Microsecond))
		switch {
		case r.Detail != "":
			s += ": " + oneLine(r.Detail) // the evidence, status included
		case r.Status != 0:
			s += fmt.Sprintf(" (HTTP %d)", r.Status)
		}
		return s
	case Transferring:
		return fmt.Sprintf("transferring hop %d → %s (attempt %d, %s)", r.Hop, r.Dest, r.Attempt, r.Detail)
	case Transferred:
		return fmt.Sprintf("transferred  hop %d → %s: confirmed", r.Hop, r.Dest)
	case Settled:
		return fmt.Sprintf("settled      hop %d: %s", r.Hop, r.Detail)
	case Released:
		return fmt.Sprintf("released     hop %d: handed back to the broker", r.Hop)
	case 0:
		return "unreadable   " + r.Detail
	}
	return r.Kind.String()
}

// KindName is r's kind as a timeline names it: "unreadable" for a record
// that could not be decoded.
func (r Record) KindName() string {
	if r.Kind == 0 {
		return "unreadable"
	}
	return r.Kind.String()
}

// lineBreaks are written as escapes: an app's error page in the evidence
// must not break a timeline into lines that read as records.
var lineBreaks = strings.NewReplacer("\r", `\r`, "\n", `\n`)

// oneLine is s on one line.
func oneLine(s string) string { return lineBreaks.Replace(s) }
