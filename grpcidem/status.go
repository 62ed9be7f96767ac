package grpcidem

import (
	"context"
	"errors"
	"time"

	"github.com/onceonly/idempotency"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrorDomain is the domain of the errdetails.ErrorInfo that every status
// of Status carries; its Reason names the problem (KEY_REUSED, …).
const ErrorDomain = "github.com/onceonly/idempotency"

// A problem is one row of the code table in docs/grpc.md. Its message is
// fixed and never an error's text, so a Redis failure leaks nothing.
type problem struct {
	err     error
	code    codes.Code
	reason  string
	message string
}

var problems = []problem{
	{idempotency.ErrMissingKey, codes.InvalidArgument, "MISSING_KEY",
		"this method requires an idempotency key"},
	{idempotency.ErrInvalidKey, codes.InvalidArgument, "INVALID_KEY",
		"the idempotency key must be one printable ASCII value and not too long"},
	{idempotency.ErrNoScope, codes.Unauthenticated, "NO_SCOPE",
		"the call does not identify the caller the key belongs to"},
	{idempotency.ErrKeyReused, codes.FailedPrecondition, "KEY_REUSED",
		"the idempotency key was already used for a different request"},
	{idempotency.ErrInProgress, codes.Aborted, "IN_PROGRESS",
		"a call with this idempotency key is still being processed; retry later"},
	{idempotency.ErrInterrupted, codes.FailedPrecondition, "INTERRUPTED",
		"a call with this idempotency key was claimed by a server that stopped before it answered; its outcome is unknown"},
	{idempotency.ErrNotReplayable, codes.DataLoss, "NOT_REPLAYABLE",
		"the call was executed, but its response was too large to store"},
	{idempotency.ErrUnreadableRecord, codes.DataLoss, "UNREADABLE_RECORD",
		"the call was executed, but its stored response cannot be read"},
	{idempotency.ErrStoreUnavailable, codes.Unavailable, "STORE_UNAVAILABLE",
		"the idempotency store is unavailable; the call was not executed, retry later"},
}

// Status is the gRPC status that UnaryServerInterceptor answers err with,
// for an error of idempotency.Do: a fixed code and message per sentinel
// error, with an errdetails.ErrorInfo naming it and, when a retry may
// succeed later, an errdetails.RetryInfo with idempotency.RetryAfter's
// delay. Context errors become CANCELLED or DEADLINE_EXCEEDED, and any
// other error INTERNAL.
func Status(err error) *status.Status {
	// Problems first: a store timeout wraps ErrStoreUnavailable around a
	// context error, and it is the store's.
	for _, p := range problems {
		if errors.Is(err, p.err) {
			return p.status(idempotency.RetryAfter(err))
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.New(status.FromContextError(err).Code(), "the call ended before it was answered")
	}
	return status.New(codes.Internal, "the call could not be processed")
}

func (p problem) status(retryAfter time.Duration) *status.Status {
	s := status.New(p.code, p.message)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: p.reason, Domain: ErrorDomain}}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	withDetails, err := s.WithDetails(details...)
	if err != nil { // only a detail that cannot be marshalled fails this
		return s
	}
	return withDetails
}
