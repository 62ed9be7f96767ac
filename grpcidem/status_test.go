package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/grpcidem"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
)

// The code table of docs/grpc.md.
func TestStatusMapsProblemsToCodes(t *testing.T) {
	redisDown := fmt.Errorf("%w: %w", idempotency.ErrStoreUnavailable, context.DeadlineExceeded)
	for _, tc := range []struct {
		err        error
		code       codes.Code
		reason     string
		retryAfter time.Duration
	}{
		{idempotency.ErrMissingKey, codes.InvalidArgument, "MISSING_KEY", 0},
		{idempotency.ErrInvalidKey, codes.InvalidArgument, "INVALID_KEY", 0},
		{idempotency.ErrNoScope, codes.Unauthenticated, "NO_SCOPE", 0},
		{idempotency.ErrKeyReused, codes.FailedPrecondition, "KEY_REUSED", 0},
		{idempotency.ErrInProgress, codes.Aborted, "IN_PROGRESS", time.Second},
		{idempotency.ErrInterrupted, codes.FailedPrecondition, "INTERRUPTED", 0},
		{idempotency.ErrNotReplayable, codes.DataLoss, "NOT_REPLAYABLE", 0},
		{idempotency.ErrUnreadableRecord, codes.DataLoss, "UNREADABLE_RECORD", 0},
		{redisDown, codes.Unavailable, "STORE_UNAVAILABLE", time.Second},
		{context.Canceled, codes.Canceled, "", 0},
		{context.DeadlineExceeded, codes.DeadlineExceeded, "", 0},
		{errors.New("disk on fire"), codes.Internal, "", 0},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			err := grpcidem.Status(tc.err).Err()
			require.Equal(t, tc.code, grpcidem.Status(tc.err).Code())
			reason, retryAfter := problemOf(err)
			require.Equal(t, tc.reason, reason)
			require.Equal(t, tc.retryAfter, retryAfter)
		})
	}
	require.NotContains(t, grpcidem.Status(redisDown).Message(), "deadline", "a cause never reaches the client")
	require.NotContains(t, grpcidem.Status(errors.New("disk on fire")).Message(), "disk")
}
