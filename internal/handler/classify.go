package handler

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"handoff.dev/handoff/internal/budget"
)

// Classifier maps the app's answers to outcomes, HTTP and gRPC alike: the
// default tables of DESIGN §4 with the operator's overrides applied. It is
// immutable and safe for concurrent use.
type Classifier struct {
	status map[int]budget.Outcome
	class  [6]budget.Outcome             // by the first digit of the status
	codes  map[codes.Code]budget.Outcome // gRPC; nil is defaultCodes
}

// NewClassifier builds a classifier from overrides keyed by status ("404") or
// class ("5xx"), valued by outcome name ("permanent"). Exact statuses win over
// classes.
func NewClassifier(overrides map[string]string) (*Classifier, error) {
	c := &Classifier{
		status: map[int]budget.Outcome{
			409: budget.Defer,
			410: budget.Drop,
			429: budget.Overload,
			503: budget.Overload,
		},
		class: [6]budget.Outcome{
			1: budget.Retry, // an interim answer is not a final one
			2: budget.Success,
			3: budget.Permanent, // the handler URL is wrong
			4: budget.Permanent,
			5: budget.Retry,
		},
	}
	for key, name := range overrides {
		o, ok := budget.ParseOutcome(name)
		if !ok {
			return nil, fmt.Errorf("outcome %q for %q: unknown outcome", name, key)
		}
		if len(key) == 3 && strings.HasSuffix(key, "xx") && key[0] >= '1' && key[0] <= '5' {
			d := int(key[0] - '0')
			c.class[d] = o
			// A class override also covers the default exact entries in it,
			// unless the operator names those exactly too.
			for s := range c.status {
				if s/100 == d {
					if _, exact := overrides[strconv.Itoa(s)]; !exact {
						delete(c.status, s)
					}
				}
			}
			continue
		}
		s, err := strconv.Atoi(key)
		if err != nil || s < 100 || s > 599 || strconv.Itoa(s) != key {
			return nil, fmt.Errorf("status %q: want 100-599 or a class such as 5xx", key)
		}
		c.status[s] = o
	}
	return c, nil
}

// Status classifies a status code alone.
func (c *Classifier) Status(code int) budget.Outcome {
	if o, ok := c.status[code]; ok {
		return o
	}
	if d := code / 100; d >= 1 && d <= 5 {
		return c.class[d]
	}
	return budget.Permanent
}

// Response classifies a response: the app's Handoff-Outcome header wins over
// the status; Retry-After is read for any outcome that schedules a retry.
func (c *Classifier) Response(code int, h http.Header, now time.Time) (budget.Outcome, time.Duration) {
	return c.Answer(code, h.Get("Handoff-Outcome"), h.Get("Retry-After"), now)
}

// Answer is Response given the answer's Handoff-Outcome and Retry-After
// values (empty when absent).
func (c *Classifier) Answer(code int, outcome, retryAfter string, now time.Time) (budget.Outcome, time.Duration) {
	o := c.Status(code)
	if v := outcome; v != "" {
		if declared, ok := budget.ParseOutcome(strings.ToLower(strings.TrimSpace(v))); ok {
			o = declared
		}
	}
	var after time.Duration
	if v := retryAfter; v != "" {
		after = ParseRetryAfter(v, now)
	}
	return o, after
}

// maxRetryAfter keeps an app's Retry-After from parking a message longer
// than any deadline could allow.
const maxRetryAfter = 24 * time.Hour

// ParseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date.
// Anything unreadable or in the past is zero.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if isDigits(v) {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return maxRetryAfter // more digits than int64 holds: a very long delay
		}
		return time.Duration(min(secs, int64(maxRetryAfter/time.Second))) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil || !t.After(now) {
		return 0
	}
	return min(t.Sub(now), maxRetryAfter)
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
