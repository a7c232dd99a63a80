package handler

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	handlerv1 "handoff.dev/handoff/api/handler/v1"
	"handoff.dev/handoff/internal/budget"
)

// defaultCodes is DESIGN §4's table for gRPC status codes, the one the
// proto's comment shows. A code not in it (there is none today) is
// permanent, like an HTTP status outside every class.
var defaultCodes = map[codes.Code]budget.Outcome{
	codes.Unavailable:        budget.Retry,
	codes.Aborted:            budget.Retry,
	codes.Internal:           budget.Retry,
	codes.Unknown:            budget.Retry,
	codes.DataLoss:           budget.Retry,
	codes.ResourceExhausted:  budget.Overload,
	codes.DeadlineExceeded:   budget.Unknown,
	codes.Canceled:           budget.Unknown,
	codes.FailedPrecondition: budget.Defer,
	codes.InvalidArgument:    budget.Permanent,
	codes.Unimplemented:      budget.Permanent,
	codes.NotFound:           budget.Permanent,
	codes.OutOfRange:         budget.Permanent,
	codes.PermissionDenied:   budget.Permanent,
	codes.Unauthenticated:    budget.Permanent,
	codes.AlreadyExists:      budget.Permanent,
}

// WithGRPC returns a copy of c whose gRPC table has the operator's
// overrides, keyed by code name (UNAVAILABLE, case-insensitive) and valued
// by outcome name. OK cannot be overridden: with OK the response's outcome
// decides.
func (c *Classifier) WithGRPC(overrides map[string]string) (*Classifier, error) {
	out := *c
	out.codes = maps.Clone(defaultCodes)
	for key, name := range overrides {
		code, ok := ParseCode(key)
		if !ok {
			return nil, fmt.Errorf("code %q: want a gRPC status code name such as UNAVAILABLE", key)
		}
		o, ok := budget.ParseOutcome(name)
		if !ok {
			return nil, fmt.Errorf("outcome %q for %q: unknown outcome", name, key)
		}
		out.codes[code] = o
	}
	return &out, nil
}

// ParseCode reads a gRPC status code's name (UNAVAILABLE, unavailable). OK
// is not a failure and has no entry.
func ParseCode(name string) (codes.Code, bool) {
	var code codes.Code
	if err := code.UnmarshalJSON([]byte(strconv.Quote(strings.ToUpper(name)))); err != nil || code == codes.OK {
		return 0, false
	}
	if _, err := strconv.Atoi(name); err == nil {
		return 0, false // by name only: numbers are unreadable in a config
	}
	return code, true
}

// Code classifies an error status the app answered with.
func (c *Classifier) Code(code codes.Code) budget.Outcome {
	table := c.codes
	if table == nil {
		table = defaultCodes
	}
	if o, ok := table[code]; ok {
		return o
	}
	return budget.Permanent
}

// callReach is how far a gRPC call that ended in an error got: it decides
// whether its status is the app's answer or the transport's.
type callReach uint8

const (
	// notSent: the call never went out on a connection. With no connection
	// to the app (refused, nothing listening, TLS failed) the app is down;
	// with one, every stream the app allows was taken.
	notSent callReach = iota
	// sent: the call went out and no answer came back (a timeout, a broken
	// connection): its effect may have happened.
	sent
	// answered: the app sent a gRPC answer; its status is the app's own.
	answered
)

// GRPC classifies the end of one gRPC call. An answer's outcome enum wins;
// OUTCOME_UNSPECIFIED with OK is success. An error status the app answered
// with is classified by code (Code); one the transport made up is about how
// far the call got: never sent and no connection to the app is
// Unreachable (hold, burn no attempt), exactly as a refused HTTP
// connection; never sent on a live connection for want of a stream is
// Overload (the app's SETTINGS_MAX_CONCURRENT_STREAMS is full), and for any
// other reason is classified by its code; sent without an answer is
// Unknown. retryAfter is the response's retry_after, or a status's
// google.rpc.RetryInfo.
func (c *Classifier) GRPC(resp handlerv1.Outcome, respAfter time.Duration, err error, reach callReach, connected bool) (budget.Outcome, time.Duration) {
	if err == nil {
		return outcomeOf(resp), clampAfter(respAfter)
	}
	st := status.Convert(err)
	switch reach {
	case notSent:
		switch st.Code() {
		case codes.Unavailable, codes.Canceled:
			// No connection to the app (refused, nothing listening, TLS
			// failed): grpc-go fails such a call fast with UNAVAILABLE.
			return budget.Unreachable, 0
		case codes.DeadlineExceeded:
			if connected {
				return budget.Overload, 0 // waited for a free stream
			}
			return budget.Unreachable, 0
		}
		// Refused before it went out for a reason of its own (a header
		// list over the app's limit, a message over the size limit):
		// about this message, not the app, whatever the connection's
		// state reads at this instant. Unreachable would hold intake and
		// try it again for ever, the probe passing each time; the code
		// table spends its attempts instead.
		return c.Code(st.Code()), 0
	case sent:
		return budget.Unknown, 0
	}
	var after time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			after = clampAfter(ri.GetRetryDelay().AsDuration())
		}
	}
	return c.Code(st.Code()), after
}

// outcomeOf maps the app's verdict; UNSPECIFIED is success: the app
// answered OK. A value this build does not know is unknown: never acked on
// a guess, retried flagged redelivered.
func outcomeOf(o handlerv1.Outcome) budget.Outcome {
	switch o {
	case handlerv1.Outcome_OUTCOME_UNSPECIFIED, handlerv1.Outcome_OUTCOME_SUCCESS:
		return budget.Success
	case handlerv1.Outcome_OUTCOME_RETRY:
		return budget.Retry
	case handlerv1.Outcome_OUTCOME_OVERLOAD:
		return budget.Overload
	case handlerv1.Outcome_OUTCOME_DEFER:
		return budget.Defer
	case handlerv1.Outcome_OUTCOME_PERMANENT:
		return budget.Permanent
	case handlerv1.Outcome_OUTCOME_DROP:
		return budget.Drop
	}
	return budget.Unknown
}

func clampAfter(d time.Duration) time.Duration { return min(max(d, 0), maxRetryAfter) }
