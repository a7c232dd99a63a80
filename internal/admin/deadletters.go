package admin

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	adminv1 "handoff.dev/handoff/api/admin/v1"
	"handoff.dev/handoff/internal/broker"
	"handoff.dev/handoff/internal/deadletter"
	"handoff.dev/handoff/internal/redact"
)

// DeadLetters is what the admin API asks of the dead letters of every
// source: the calls of *deadletter.Manager it makes. Its methods must be
// safe for concurrent use.
type DeadLetters interface {
	SourceNames() []string
	List(f deadletter.Filter) (deadletter.Page, error)
	Counts(source string) (deadletter.Counts, error)
	Get(id deadletter.ID) (deadletter.Letter, error)
	// Message reads a dead letter's DLQ entry: its body, key and headers.
	Message(ctx context.Context, id deadletter.ID) (*broker.Message, error)
	// Apply records an operator's Approve or Terminate.
	Apply(ctx context.Context, c deadletter.Change) (deadletter.Letter, error)
	CreateReplay(ctx context.Context, r deadletter.ReplayRequest) (deadletter.Run, error)
	Replay(id string) (deadletter.Run, error)
	Replays(source string) ([]deadletter.Run, error)
	CancelReplay(ctx context.Context, id, who, why string) (deadletter.Run, error)
	PauseReplay(ctx context.Context, id, who, why string) (deadletter.Run, error)
	ResumeReplay(ctx context.Context, id, who, why string) (deadletter.Run, error)
}

var _ DeadLetters = (*deadletter.Manager)(nil)

// DefaultTokenName is who the ledger records for a call with the admin
// token when Options.TokenName is empty.
const DefaultTokenName = "admin"

// MaxOperatorLen bounds a request's operator, which the ledger records
// after the token's name.
const MaxOperatorLen = 64

// Body limits of GetDeadLetter.
const (
	DefaultBodyLimit = 64 << 10
	MaxBodyLimit     = 1 << 20
)

// maxContentType bounds a repair's content type, as a ledger record does.
const maxContentType = 256

// errNoDeadLetters answers every dead-letter and replay call of a sidecar
// that keeps no dead letters.
var errNoDeadLetters = grpcstatus.Error(codes.Unavailable,
	"dead letters are not served here: this sidecar runs no dead-letter manager")

// deadLetters returns the dead letters, or the error to answer when the
// sidecar keeps none.
func (s *service) deadLetters() (DeadLetters, error) {
	if s.o.DeadLetters == nil {
		return nil, errNoDeadLetters
	}
	return s.o.DeadLetters, nil
}

// who is what the ledger records as having made a change: the token's
// name, and after it the operator the request names. The operator is not
// verified (anyone with the token may name anyone); it only says which
// person behind a shared token acted.
func (s *service) who(operator string) (string, error) {
	if operator == "" {
		return s.o.TokenName, nil
	}
	if len(operator) > MaxOperatorLen || !redact.Printable(operator) {
		return "", grpcstatus.Errorf(codes.InvalidArgument, "operator: want at most %d bytes of printable text", MaxOperatorLen)
	}
	return s.o.TokenName + "/" + operator, nil
}

// why checks a reason given with a change: required where the change needs
// one, and no longer than a ledger record holds.
func why(field, s string, required bool) error {
	if required && strings.TrimSpace(s) == "" {
		return grpcstatus.Errorf(codes.InvalidArgument, "%s is required: say why, for whoever reads the ledger next", field)
	}
	if len(s) > deadletter.MaxWhyLen {
		return grpcstatus.Errorf(codes.InvalidArgument, "%s: at most %d bytes", field, deadletter.MaxWhyLen)
	}
	return nil
}

// parseID reads a request's dead-letter id.
func parseID(field, s string) (deadletter.ID, error) {
	if s == "" {
		return deadletter.ID{}, grpcstatus.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	id, err := deadletter.ParseID(s)
	if err != nil {
		return deadletter.ID{}, grpcstatus.Errorf(codes.InvalidArgument, "%s: %v", field, err)
	}
	return id, nil
}

// fail is the answer to a call the dead letters refused or could not
// serve. What the caller can act on keeps its message; anything else is
// logged and answered without internals.
func (s *service) fail(op string, err error) error {
	var illegal *deadletter.IllegalError
	switch {
	case errors.As(err, &illegal):
		return grpcstatus.Error(codes.FailedPrecondition, illegal.Error())
	case errors.Is(err, deadletter.ErrIllegal):
		return grpcstatus.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, deadletter.ErrLost):
		return grpcstatus.Error(codes.Aborted, err.Error())
	case errors.Is(err, deadletter.ErrNotFound), errors.Is(err, deadletter.ErrNoSource), errors.Is(err, deadletter.ErrNoRun):
		return grpcstatus.Error(codes.NotFound, err.Error())
	case errors.Is(err, deadletter.ErrBadID), errors.Is(err, deadletter.ErrBadRequest):
		return grpcstatus.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return grpcstatus.FromContextError(err).Err()
	}
	s.log.Error("admin: "+op, "err", err)
	return grpcstatus.Errorf(codes.Internal, "%s failed; the sidecar's log says why", op)
}

func (s *service) ListDeadLetters(_ context.Context, req *adminv1.ListDeadLettersRequest) (*adminv1.ListDeadLettersResponse, error) {
	dl, err := s.deadLetters()
	if err != nil {
		return nil, err
	}
	if req.GetPageSize() < 0 {
		return nil, grpcstatus.Error(codes.InvalidArgument, "page_size: want 0 or more")
	}
	f := deadletter.Filter{
		Source:  req.GetSource(),
		Reason:  req.GetReason(),
		EventID: req.GetEventId(),
		After:   req.GetPageToken(),
		Limit:   min(int(req.GetPageSize()), deadletter.MaxLimit),
	}
	if f.States, err = states(req.GetStates()); err != nil {
		return nil, err
	}
	if f.Since, f.Until, err = timeRange(req.GetSince(), req.GetUntil()); err != nil {
		return nil, err
	}
	// The counts first: they say NotFound for a source the sidecar does
	// not have, where the list would only be empty.
	sources := dl.SourceNames()
	if f.Source != "" {
		sources = []string{f.Source}
	}
	out := &adminv1.ListDeadLettersResponse{}
	now := s.o.Now()
	for _, src := range sources {
		c, err := dl.Counts(src)
		if err != nil {
			return nil, s.fail("counting dead letters", err)
		}
		out.Counts = append(out.Counts, countsProto(src, c, now))
	}
	page, err := dl.List(f)
	if err != nil {
		return nil, s.fail("listing dead letters", err)
	}
	for i := range page.Letters {
		out.DeadLetters = append(out.DeadLetters, letterProto(&page.Letters[i], false))
	}
	out.NextPageToken = page.Next
	return out, nil
}

func (s *service) GetDeadLetter(ctx context.Context, req *adminv1.GetDeadLetterRequest) (*adminv1.DeadLetter, error) {
	dl, err := s.deadLetters()
	if err != nil {
		return nil, err
	}
	id, err := parseID("id", req.GetId())
	if err != nil {
		return nil, err
	}
	limit := int(req.GetBodyLimit())
	switch {
	case limit < 0:
		return nil, grpcstatus.Error(codes.InvalidArgument, "body_limit: want 0 or more")
	case limit == 0:
		limit = DefaultBodyLimit
	}
	limit = min(limit, MaxBodyLimit)
	l, err := dl.Get(id)
	if err != nil {
		return nil, s.fail("reading a dead letter", err)
	}
	out := letterProto(&l, true)

	m, err := dl.Message(ctx, id)
	switch {
	case err == nil:
		out.Body = m.Body
		if len(m.Body) > limit {
			out.Body, out.BodyTruncated = m.Body[:limit], true
		}
	case errors.Is(err, deadletter.ErrNotFound):
		out.BodyError = "the DLQ no longer holds it: its retention removed it"
	case ctx.Err() != nil:
		return nil, grpcstatus.FromContextError(ctx.Err()).Err()
	default:
		// The evidence and history are worth showing without the body.
		s.log.Warn("admin: reading a dead letter's body", "id", id.String(), "err", err)
		out.BodyError = "reading the DLQ failed; the sidecar's log says why"
	}

	if l.EventID != "" {
		handoffs, err := s.o.Journal.Event(l.Source, l.EventID)
		if err != nil {
			s.log.Warn("admin: reading the journal", "err", err)
		} else {
			out.Handoffs = event(l.Source, l.EventID, handoffs).GetHandoffs()
		}
	}
	return out, nil
}

// change checks what every change by hand carries — the dead letters
// served, the id, who, a reason — and returns the change to apply.
func (s *service) change(id, operator, reason string, t deadletter.Transition) (DeadLetters, deadletter.Change, error) {
	dl, err := s.deadLetters()
	if err != nil {
		return nil, deadletter.Change{}, err
	}
	pid, err := parseID("id", id)
	if err != nil {
		return nil, deadletter.Change{}, err
	}
	who, err := s.who(operator)
	if err != nil {
		return nil, deadletter.Change{}, err
	}
	if err := why("reason", reason, true); err != nil {
		return nil, deadletter.Change{}, err
	}
	return dl, deadletter.Change{ID: pid, Transition: t, Who: who, Why: reason}, nil
}

func (s *service) ApproveDeadLetter(ctx context.Context, req *adminv1.ApproveDeadLetterRequest) (*adminv1.DeadLetter, error) {
	dl, c, err := s.change(req.GetId(), req.GetOperator(), req.GetReason(), deadletter.Approve)
	if err != nil {
		return nil, err
	}
	repair, err := repairOf(req)
	if err != nil {
		return nil, err
	}
	if repair != nil && repair.ContentType == "" {
		// The repair replaces the body, not what the body is.
		l, err := dl.Get(c.ID)
		if err != nil {
			return nil, s.fail("approving a dead letter", err)
		}
		repair.ContentType = l.ContentType
	}
	c.Repair = repair
	l, err := dl.Apply(ctx, c)
	if err != nil {
		return nil, s.fail("approving a dead letter", err)
	}
	return letterProto(&l, true), nil
}

// repairOf is an approval's repair, nil when it replays the original.
func repairOf(req *adminv1.ApproveDeadLetterRequest) (*deadletter.Repair, error) {
	body, ct, note := req.GetRepairBody(), req.GetRepairContentType(), req.GetRepairNote()
	switch {
	case len(body) == 0 && (ct != "" || note != ""):
		return nil, grpcstatus.Error(codes.InvalidArgument, "repair_content_type and repair_note go with a repair_body")
	case len(body) == 0:
		return nil, nil
	case len(body) > deadletter.MaxRepairBody:
		return nil, grpcstatus.Errorf(codes.InvalidArgument, "repair_body: %d bytes, at most %d", len(body), deadletter.MaxRepairBody)
	case len(ct) > maxContentType || !redact.Printable(ct):
		return nil, grpcstatus.Errorf(codes.InvalidArgument, "repair_content_type: want at most %d bytes of printable text", maxContentType)
	}
	if err := why("repair_note", note, false); err != nil {
		return nil, err
	}
	return &deadletter.Repair{Body: body, ContentType: ct, Note: note}, nil
}

func (s *service) TerminateDeadLetter(ctx context.Context, req *adminv1.TerminateDeadLetterRequest) (*adminv1.DeadLetter, error) {
	dl, c, err := s.change(req.GetId(), req.GetOperator(), req.GetReason(), deadletter.Terminate)
	if err != nil {
		return nil, err
	}
	l, err := dl.Apply(ctx, c)
	if err != nil {
		return nil, s.fail("terminating a dead letter", err)
	}
	return letterProto(&l, true), nil
}
