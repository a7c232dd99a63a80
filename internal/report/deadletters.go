package report

import (
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	adminv1 "handoff.dev/handoff/api/admin/v1"

	"google.golang.org/protobuf/types/known/timestamppb"

	"handoff.dev/handoff/internal/deadletter"
)

// DeadLetters prints a list as a table, then the counts of each
// source.
func DeadLetters(w io.Writer, l *adminv1.ListDeadLettersResponse) {
	if len(l.GetDeadLetters()) == 0 {
		fmt.Fprintln(w, "no dead letters match")
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tSOURCE\tREASON\tATTEMPTS\tDEAD-LETTERED\tEVENT")
		for _, d := range l.GetDeadLetters() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", Shown(d.GetId()), d.GetState(), Shown(d.GetSource()), Shown(d.GetReason()),
				d.GetAttempts(), tableTime(d.GetDeadLetteredAt()), Shown(d.GetEventId()))
		}
		_ = tw.Flush()
	}
	if l.GetNextPageToken() != "" {
		fmt.Fprintln(w, "(more: --all lists every page)")
	}
	fmt.Fprintln(w)
	for _, c := range l.GetCounts() {
		fmt.Fprintln(w, countsLine(c))
	}
}

// countsLine is what an operator watches of one source: the open count and
// the oldest open one's age first, then the count by state.
func countsLine(c *adminv1.DeadLetterCounts) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: open %d", c.GetSource(), c.GetOpen())
	if c.GetOpen() > 0 && c.GetOldestOpenAge() != nil {
		fmt.Fprintf(&b, ", oldest open %s", c.GetOldestOpenAge().AsDuration().Round(time.Second))
	}
	var parts []string
	by := maps.Clone(c.GetByState())
	for _, s := range deadletter.States {
		if n, ok := by[string(s)]; ok {
			parts = append(parts, fmt.Sprintf("%s %d", s, n))
			delete(by, string(s))
		}
	}
	for _, s := range slices.Sorted(maps.Keys(by)) { // a state a newer sidecar knows
		parts = append(parts, fmt.Sprintf("%s %d", Shown(s), by[s]))
	}
	if len(parts) > 0 {
		b.WriteString("; " + strings.Join(parts, ", "))
	}
	return b.String()
}

// tableTime is a time for a table: UTC to the second; "-" when unset.
func tableTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

// Shown is s as it is when it is printable, quoted otherwise: what a
// broker's header or an app's error says must not steer the terminal.
func Shown(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) || r == utf8.RuneError {
			return strconv.Quote(s)
		}
	}
	return s
}

// DeadLetter prints one dead letter for a reader.
func DeadLetter(w io.Writer, d *adminv1.DeadLetter) {
	field := func(name, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-15s%s\n", name, v)
		}
	}
	field("id", Shown(d.GetId()))
	field("source", Shown(d.GetSource()))
	field("state", d.GetState())
	field("event", Shown(d.GetEventId()))
	field("reason", Shown(d.GetReason()))
	errLine := Shown(d.GetError())
	if d.GetErrorClass() != "" {
		errLine += " (" + Shown(d.GetErrorClass()) + ")"
	}
	field("error", strings.TrimSpace(errLine))
	field("attempts", strconv.Itoa(int(d.GetAttempts())))
	field("origin", Shown(d.GetOrigin()))
	if d.GetFirstFailureAt() != nil {
		field("first failure", tableTime(d.GetFirstFailureAt()))
	}
	field("dead-lettered", tableTime(d.GetDeadLetteredAt()))
	if d.GetReplayOf() != "" {
		field("replay of", Shown(d.GetReplayOf())+" (replay "+Shown(d.GetReplayId())+")")
	}
	field("successor", Shown(d.GetSuccessor()))
	field("content type", Shown(d.GetContentType()))
	if len(d.GetKey()) > 0 {
		field("key", Shown(string(d.GetKey())))
	}
	if len(d.GetHeaders()) > 0 {
		fmt.Fprintln(w, "headers")
		for _, k := range slices.Sorted(maps.Keys(d.GetHeaders())) {
			fmt.Fprintf(w, "  %s: %s\n", Shown(k), Shown(d.GetHeaders()[k]))
		}
	}

	switch {
	case d.GetBodyError() != "":
		fmt.Fprintf(w, "body (%s): %s\n", ByteSize(d.GetBodySize()), d.GetBodyError())
	case d.GetBodyTruncated():
		fmt.Fprintf(w, "body (%s, the first %s shown; --body-limit shows more)\n", ByteSize(d.GetBodySize()), ByteSize(int64(len(d.GetBody()))))
		writeBody(w, d.GetBody())
	default:
		fmt.Fprintf(w, "body (%s)\n", ByteSize(int64(len(d.GetBody()))))
		writeBody(w, d.GetBody())
	}
	if r := d.GetRepair(); r != nil {
		fmt.Fprintf(w, "repair (%s, %s)", ByteSize(int64(len(r.GetBody()))), Shown(r.GetContentType()))
		if r.GetNote() != "" {
			fmt.Fprintf(w, ": %s", Shown(r.GetNote()))
		}
		fmt.Fprintln(w)
		writeBody(w, r.GetBody())
	}
	if len(d.GetHistory()) > 0 {
		fmt.Fprintln(w, "history")
		for _, h := range d.GetHistory() {
			fmt.Fprintf(w, "  %s  %s\n", tableTime(h.GetAt()), historyLine(h))
		}
	}
	if len(d.GetHandoffs()) > 0 {
		fmt.Fprintln(w, "timeline")
		Event(indentWriter{w}, &adminv1.Event{Source: d.GetSource(), EventId: d.GetEventId(), Handoffs: d.GetHandoffs()})
	} else if d.GetEventId() != "" {
		// The timeline is the journal's, and a journal is one replica's.
		fmt.Fprintln(w, "timeline       not in this replica's journal: the replica that handled the event has it")
	}
}

// historyLine is one ledger record: the transition, who, why.
func historyLine(h *adminv1.LedgerRecord) string {
	s := fmt.Sprintf("%s → %s by %s", h.GetTransition(), h.GetState(), Shown(h.GetWho()))
	if h.GetReplayId() != "" {
		s += " (replay " + Shown(h.GetReplayId()) + ")"
	}
	if h.GetSuccessor() != "" {
		s += " (became " + Shown(h.GetSuccessor()) + ")"
	}
	if h.GetRepair() != nil {
		s += fmt.Sprintf(" with a repair of %s", ByteSize(int64(len(h.GetRepair().GetBody()))))
	}
	if h.GetWhy() != "" {
		s += ": " + Shown(h.GetWhy())
	}
	return s
}

// writeBody prints a body indented: as text when it is printable text, as
// a hex dump otherwise.
func writeBody(w io.Writer, b []byte) {
	if len(b) == 0 {
		return
	}
	if textBody(b) {
		for line := range strings.Lines(string(b)) {
			fmt.Fprintf(w, "  %s\n", strings.TrimRight(line, "\r\n"))
		}
		return
	}
	for line := range strings.Lines(hex.Dump(b)) {
		fmt.Fprintf(w, "  %s", line)
	}
}

// textBody reports whether b is UTF-8 text without control characters other
// than line breaks and tabs (a body cut in the middle of a character still
// counts).
func textBody(b []byte) bool {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 && !(len(b) < utf8.UTFMax && !utf8.FullRune(b)) {
			return false
		}
		if r != '\n' && r != '\r' && r != '\t' && unicode.IsControl(r) {
			return false
		}
		b = b[n:]
	}
	return true
}

// indentWriter writes every line two spaces in.
type indentWriter struct{ w io.Writer }

func (i indentWriter) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		if _, err := io.WriteString(i.w, "  "+line); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Changed says what a change left: the state, and the repair if any.
func Changed(d *adminv1.DeadLetter) string {
	s := d.GetState()
	if r := d.GetRepair(); r != nil && d.GetState() == string(deadletter.Approved) {
		s += fmt.Sprintf(", with a repair of %s (%s)", ByteSize(int64(len(r.GetBody()))), Shown(r.GetContentType()))
	}
	if h := d.GetHistory(); len(h) > 0 {
		s += " by " + Shown(h[len(h)-1].GetWho())
	}
	return s
}
