package journal

import (
	"strings"
	"testing"
	"time"

	"handoff.dev/handoff/internal/budget"
)

// Evidence with line breaks (an app's HTML error page) stays on its record's
// one line of a timeline.
func TestTextKeepsEvidenceOnOneLine(t *testing.T) {
	r := Record{Kind: Outcome, Attempt: 2, Outcome: uint8(budget.Retry), Latency: 3 * time.Millisecond,
		Detail: "HTTP 501: <html>\r\n  <p>Unsupported method</p>\n</html>"}
	got := r.Text()
	if strings.ContainsAny(got, "\r\n") {
		t.Fatalf("Text() = %q: spans lines", got)
	}
	want := `attempt 2    retry, answered in 3ms: HTTP 501: <html>\r\n  <p>Unsupported method</p>\n</html>`
	if got != want {
		t.Errorf("Text() = %q, want %q", got, want)
	}
}
