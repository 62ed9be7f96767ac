package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/grpcidem"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// stepPayments charges in two steps: a provider's charge (a Go value) and
// a ledger entry (a protobuf message, as another gRPC service answers).
// Its first call fails after the charge, as a dependency that is down.
type stepPayments struct {
	charges, calls atomic.Int64
}

func (p *stepPayments) Charge(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	id, err := idempotency.Step(ctx, "charge", func(context.Context) (int64, error) { return p.charges.Add(1), nil })
	if err != nil {
		return nil, err
	}
	if p.calls.Add(1) == 1 {
		return nil, status.Error(codes.Unavailable, "the ledger is down")
	}
	entry, err := idempotency.Step(ctx, "ledger", func(context.Context) (*wrapperspb.StringValue, error) {
		return wrapperspb.String("entry"), nil
	})
	if err != nil {
		return nil, err
	}
	return wrapperspb.String(fmt.Sprintf("%s %s of charge %d", in.GetValue(), entry.GetValue(), id)), nil
}

func (*stepPayments) Watch(*wrapperspb.StringValue, grpc.ServerStream) error {
	return errors.New("not served")
}

// A method of a server whose middleware resumes runs (WithResume) journals
// its steps, whatever they return: the interceptor stores its answers as
// protobuf, and that must not make a step's Go value or message
// unjournalable. The retry after a transient failure resumes the run, and
// the charge is not made again.
func TestStepsOfAResumableMethodAreJournaled(t *testing.T) {
	svc := &stepPayments{}
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t, idempotency.WithResume()),
		grpcidem.WithCallerCredentials())))
	first := charge(withKey(t, "order-1"), conn, "pay")
	require.Equal(t, codes.Unavailable, status.Code(first.err), "%v", first.err)
	second := charge(withKey(t, "order-1"), conn, "pay")
	require.NoError(t, second.err)
	require.Equal(t, "pay entry of charge 1", second.value)
	require.EqualValues(t, 1, svc.charges.Load(), "the journaled charge is not made again")
}

// looseSteps journals one step whose result is a value of its own.
type looseSteps struct {
	value   any
	stepErr error
}

func (p *looseSteps) Charge(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	v, err := idempotency.Step(ctx, "charge", func(context.Context) (any, error) { return p.value, nil })
	p.stepErr = err
	return wrapperspb.String(fmt.Sprintf("%q", v)), nil
}

func (*looseSteps) Watch(*wrapperspb.StringValue, grpc.ServerStream) error {
	return errors.New("not served")
}

// The interceptor's codec writes a step's Go value as JSON, and gets the
// same round-trip check as the JSON codec: a value JSON would give back
// changed (an int64 in an interface past 2^53 comes back a float64, a
// string that is not UTF-8 gets U+FFFD) is refused with ErrNotReplayable,
// as the same step over HTTP is, rather than journaled and resumed altered.
func TestAStepOfAMethodGetsTheRoundTripCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value any
	}{
		{"an int64 past 2^53 in an interface", int64(1<<53 + 1)},
		{"a string that is not UTF-8", "caf\xe9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &looseSteps{value: tc.value}
			conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t, idempotency.WithResume()),
				grpcidem.WithCallerCredentials())))
			got := charge(withKey(t, "order-1"), conn, "pay")
			require.NoError(t, got.err)
			require.ErrorIs(t, svc.stepErr, idempotency.ErrNotReplayable)
		})
	}
}

// declinedSteps declines the charge in a step, as a final answer; its
// first call then fails as a dependency that is down, so that the next
// call resumes the run.
type declinedSteps struct {
	runs, calls atomic.Int64
}

func (p *declinedSteps) Charge(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	_, err := idempotency.Step(ctx, "charge", func(context.Context) (int64, error) {
		p.runs.Add(1)
		return 0, idempotency.Permanent(status.Error(codes.FailedPrecondition, "card declined"))
	})
	if p.calls.Add(1) == 1 {
		return nil, status.Error(codes.Unavailable, "the ledger is down")
	}
	return nil, err
}

func (*declinedSteps) Watch(*wrapperspb.StringValue, grpc.ServerStream) error {
	return errors.New("not served")
}

// A step's Permanent gRPC status survives a resume: the resumed run gets
// the status back, and the caller its code (FAILED_PRECONDITION), stored
// for every retry, not UNKNOWN with the message alone.
func TestAJournaledStatusKeepsItsCode(t *testing.T) {
	svc := &declinedSteps{}
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t, idempotency.WithResume()),
		grpcidem.WithCallerCredentials())))
	first := charge(withKey(t, "order-1"), conn, "pay")
	require.Equal(t, codes.Unavailable, status.Code(first.err), "%v", first.err)
	for range 2 { // resumed, then replayed
		got := charge(withKey(t, "order-1"), conn, "pay")
		require.Equal(t, codes.FailedPrecondition, status.Code(got.err), "%v", got.err)
		require.Contains(t, status.Convert(got.err).Message(), "card declined")
	}
	require.EqualValues(t, 1, svc.runs.Load(), "the journaled decline is not asked again")
}
