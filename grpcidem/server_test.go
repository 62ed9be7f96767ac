package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/grpcidem"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Two server instances on one Redis: 50 concurrent calls over 5 keys, each
// call to either instance, run the method 5 times, and every call with a key
// gets that key's one response.
func TestConcurrentDuplicatesAcrossInstancesRunOncePerKey(t *testing.T) {
	svc := newPayments()
	conns := []*grpc.ClientConn{
		dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials()))),
		dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials()))),
	}
	type result struct {
		key int
		reply
	}
	results := make(chan result, 50)
	var wg sync.WaitGroup
	for i := range 50 {
		key, conn := i%5, conns[i/5%2]
		wg.Go(func() {
			ctx := withKey(t, fmt.Sprint("order-", key))
			results <- result{key, charge(ctx, conn, fmt.Sprint("slow order ", key))}
		})
	}
	wg.Wait()
	close(results)

	first := map[int]string{}
	replayed := 0
	for r := range results {
		require.NoError(t, r.err)
		if seen, ok := first[r.key]; ok {
			require.Equal(t, seen, r.value, "every call with the key gets the one response")
		} else {
			first[r.key] = r.value
		}
		if r.replayed {
			replayed++
		}
	}
	require.EqualValues(t, 5, svc.runs.Load())
	require.Len(t, first, 5)
	require.Equal(t, 45, replayed, "all but the executing call of each key are marked replayed")
}

func TestKeyReusedWithAnotherRequestIsRefused(t *testing.T) {
	svc := newPayments()
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials())))

	require.NoError(t, charge(withKey(t, "order-1"), conn, "tea").err)
	r := charge(withKey(t, "order-1"), conn, "coffee")
	require.Equal(t, codes.FailedPrecondition, status.Code(r.err), "%v", r.err)
	reason, _ := problemOf(r.err)
	require.Equal(t, "KEY_REUSED", reason)
	require.EqualValues(t, 1, svc.runs.Load())
}

// When Redis does not answer nothing runs: the call is refused with
// UNAVAILABLE and a retry delay, for the client to try again.
func TestStoreDownIsUnavailableAndNothingRuns(t *testing.T) {
	redis := redistest.Private(t)
	m := idempotency.New(redis.Client(t), idempotency.WithStoreTimeout(200*time.Millisecond))
	redis.Stop()
	svc := newPayments()
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(m, grpcidem.WithCallerCredentials())))

	r := charge(withKey(t, "order-1"), conn, "tea")
	require.Equal(t, codes.Unavailable, status.Code(r.err), "%v", r.err)
	reason, retryAfter := problemOf(r.err)
	require.Equal(t, "STORE_UNAVAILABLE", reason)
	require.Equal(t, time.Second, retryAfter)
	require.Zero(t, svc.runs.Load())
}

func TestCallWithoutKeyRunsUnprotected(t *testing.T) {
	svc := newPayments()
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials())))
	for range 2 {
		r := charge(t.Context(), conn, "tea")
		require.NoError(t, r.err)
		require.False(t, r.replayed)
	}
	require.EqualValues(t, 2, svc.runs.Load())
}

func TestRequiredKeyRefusesCallsWithoutOne(t *testing.T) {
	svc := newPayments()
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials(), grpcidem.WithRequiredKey())))

	r := charge(t.Context(), conn, "tea")
	require.Equal(t, codes.InvalidArgument, status.Code(r.err), "%v", r.err)
	reason, _ := problemOf(r.err)
	require.Equal(t, "MISSING_KEY", reason)

	twoKeys := metadata.AppendToOutgoingContext(withKey(t, "a"), grpcidem.DefaultMetadataKey, "b")
	tooLong := withKey(t, strings.Repeat("k", 300))
	for _, ctx := range []context.Context{twoKeys, withKey(t, ""), tooLong} {
		r := charge(ctx, conn, "tea")
		require.Equal(t, codes.InvalidArgument, status.Code(r.err), "%v", r.err)
		reason, _ := problemOf(r.err)
		require.Equal(t, "INVALID_KEY", reason)
	}
	require.Zero(t, svc.runs.Load())
}

// A final error is stored and replayed; an error that says nothing happened
// gives the key up, so that the retry runs; StoreNoErrors gives every
// error's key up.
func TestErrorPolicy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		code   codes.Code
		policy grpcidem.Option
		runs   int64
	}{
		{"invalid argument is stored", codes.InvalidArgument, nil, 1},
		{"unknown is stored", codes.Unknown, nil, 1},
		{"unavailable is released", codes.Unavailable, nil, 2},
		{"aborted is released", codes.Aborted, nil, 2},
		{"deadline exceeded is released", codes.DeadlineExceeded, nil, 2},
		{"store no errors releases invalid argument", codes.InvalidArgument, grpcidem.WithErrorPolicy(grpcidem.StoreNoErrors), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []grpcidem.Option{grpcidem.WithCallerCredentials()}
			if tc.policy != nil {
				opts = append(opts, tc.policy)
			}
			svc := newPayments()
			conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), opts...)))

			first := charge(withKey(t, "order-1"), conn, fmt.Sprintf("fail:%d", tc.code))
			second := charge(withKey(t, "order-1"), conn, fmt.Sprintf("fail:%d", tc.code))
			require.Equal(t, tc.runs, svc.runs.Load())
			require.Equal(t, tc.code, status.Code(first.err))
			require.Equal(t, "charge 1 refused", status.Convert(first.err).Message())
			if tc.runs == 1 {
				require.Equal(t, status.Convert(first.err).Proto().String(), status.Convert(second.err).Proto().String(),
					"the duplicate gets the first call's status")
				require.True(t, second.replayed)
			} else {
				require.Equal(t, "charge 2 refused", status.Convert(second.err).Message())
				require.False(t, second.replayed)
			}
		})
	}
}

func TestReleaseLetsTheRetryRun(t *testing.T) {
	svc := newPayments()
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials())))
	first := charge(withKey(t, "order-1"), conn, "release")
	second := charge(withKey(t, "order-1"), conn, "release")
	require.NoError(t, first.err)
	require.NoError(t, second.err)
	require.Equal(t, "charge 2 of release", second.value)
	require.EqualValues(t, 2, svc.runs.Load())
}

// A duplicate that outwaits the wait timeout is told to come back after a
// lease, with ABORTED.
func TestDuplicateOfARunningCallIsAbortedWithRetryDelay(t *testing.T) {
	svc := newPayments()
	m := middleware(t, idempotency.WithWaitTimeout(20*time.Millisecond), idempotency.WithLockLease(2*time.Second))
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(m, grpcidem.WithCallerCredentials())))

	firstDone := make(chan reply, 1)
	go func() { firstDone <- charge(withKey(t, "order-1"), conn, "slow") }()
	require.Eventually(t, func() bool { return svc.runs.Load() == 1 }, 5*time.Second, time.Millisecond)
	r := charge(withKey(t, "order-1"), conn, "slow")
	require.Equal(t, codes.Aborted, status.Code(r.err), "%v", r.err)
	reason, retryAfter := problemOf(r.err)
	require.Equal(t, "IN_PROGRESS", reason)
	require.Equal(t, 2*time.Second, retryAfter)

	first := <-firstDone
	require.NoError(t, first.err)
	again := charge(withKey(t, "order-1"), conn, "slow")
	require.NoError(t, again.err)
	require.Equal(t, first.value, again.value)
	require.EqualValues(t, 1, svc.runs.Load())
}

// A response that does not marshal fails the first call (grpc-go cannot
// send it either), and the method, which ran, never runs again for its
// key: duplicates learn that it ran and its answer is gone.
func TestAResponseThatDoesNotMarshalIsNotReplayable(t *testing.T) {
	svc := newPayments()
	m := middleware(t)
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(m, grpcidem.WithCallerCredentials())))

	first := charge(withKey(t, "order-1"), conn, "unsendable")
	require.Equal(t, codes.Internal, status.Code(first.err), "%v", first.err)
	for range 2 {
		r := charge(withKey(t, "order-1"), conn, "unsendable")
		require.Equal(t, codes.DataLoss, status.Code(r.err), "%v", r.err)
		reason, _ := problemOf(r.err)
		require.Equal(t, "NOT_REPLAYABLE", reason)
	}
	require.EqualValues(t, 1, svc.runs.Load())
}

// An answer over WithMaxResponseBytes reaches the first caller only;
// duplicates learn that the call ran but its answer is gone.
func TestTooLargeAnswerIsNotReplayable(t *testing.T) {
	svc := newPayments()
	m := middleware(t, idempotency.WithMaxResponseBytes(1024))
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(m, grpcidem.WithCallerCredentials())))

	first := charge(withKey(t, "order-1"), conn, "big")
	require.NoError(t, first.err)
	require.Len(t, first.value, 4096)
	r := charge(withKey(t, "order-1"), conn, "big")
	require.Equal(t, codes.DataLoss, status.Code(r.err), "%v", r.err)
	reason, _ := problemOf(r.err)
	require.Equal(t, "NOT_REPLAYABLE", reason)
	require.EqualValues(t, 1, svc.runs.Load())
}

func TestCallerIdentitySeparatesCallersKeys(t *testing.T) {
	// The caller named in metadata stands in for an authenticated identity
	// here; a real server takes it from its authentication.
	identity := func(ctx context.Context) (string, error) {
		if callers := metadata.ValueFromIncomingContext(ctx, "x-test-caller"); len(callers) == 1 {
			return callers[0], nil
		}
		return "", errors.New("no caller")
	}
	svc := newPayments()
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerIdentity(identity))))
	as := func(caller string) context.Context {
		return metadata.AppendToOutgoingContext(withKey(t, "order-1"), "x-test-caller", caller)
	}

	alice := charge(as("alice"), conn, "tea")
	bob := charge(as("bob"), conn, "tea")
	aliceAgain := charge(as("alice"), conn, "tea")
	require.NoError(t, alice.err)
	require.NoError(t, bob.err)
	require.NotEqual(t, alice.value, bob.value, "each caller's key runs once")
	require.Equal(t, alice.value, aliceAgain.value)
	require.True(t, aliceAgain.replayed)
	require.EqualValues(t, 2, svc.runs.Load())

	r := charge(withKey(t, "order-1"), conn, "tea")
	require.Equal(t, codes.Unauthenticated, status.Code(r.err), "%v", r.err)
	require.EqualValues(t, 2, svc.runs.Load())
}

// Under WithCallerCredentials, a key belongs to the method (and authority)
// and the call to its caller: the authorization and cookie metadata are
// part of the request's fingerprint. Another caller with the same key and
// request is refused, and so is the same caller with a refreshed token:
// never another caller's answer, never a second run. Calls without either
// share the method's keys.
func TestDefaultKeyBindsTheCaller(t *testing.T) {
	svc := newPayments()
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials())))
	as := func(key string, md ...string) context.Context {
		return metadata.AppendToOutgoingContext(withKey(t, key), md...)
	}
	refused := func(r reply) {
		t.Helper()
		require.Equal(t, codes.FailedPrecondition, status.Code(r.err), "%v", r.err)
		reason, _ := problemOf(r.err)
		require.Equal(t, "KEY_REUSED", reason)
		require.Empty(t, r.value)
	}

	alice := charge(as("order-1", "authorization", "Bearer alice"), conn, "tea")
	require.NoError(t, alice.err)
	refused(charge(as("order-1", "authorization", "Bearer bob"), conn, "tea"))
	refused(charge(as("order-1", "authorization", "Bearer alice-refreshed"), conn, "tea"))
	refused(charge(as("order-1"), conn, "tea"))
	again := charge(as("order-1", "authorization", "Bearer alice"), conn, "tea")
	require.True(t, again.replayed)
	require.Equal(t, alice.value, again.value)

	carol := charge(as("order-2", "cookie", "session=carol; theme=dark"), conn, "tea")
	require.NoError(t, carol.err)
	refused(charge(as("order-2", "cookie", "session=dave; theme=dark"), conn, "tea"))
	carolAgain := charge(as("order-2", "cookie", "theme=dark", "cookie", "session=carol"), conn, "tea")
	require.True(t, carolAgain.replayed, "the order of the cookies does not count")

	anon := charge(as("order-3"), conn, "tea")
	require.NoError(t, anon.err)
	anonAgain := charge(as("order-3"), conn, "tea")
	require.True(t, anonAgain.replayed, "calls without credentials share the method's keys")
	require.EqualValues(t, 3, svc.runs.Load())
}

// A key belongs to the authority the client addressed too: tenants routed
// by host name never share an answer; its port does not count.
func TestKeysOfTwoAuthoritiesNeverMeet(t *testing.T) {
	svc := newPayments()
	addr := serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials()))
	tenantA := dial(t, addr, grpc.WithAuthority("a.shop.test"))
	tenantB := dial(t, addr, grpc.WithAuthority("b.shop.test"))
	a := charge(withKey(t, "order-1"), tenantA, "tea")
	b := charge(withKey(t, "order-1"), tenantB, "tea")
	require.NoError(t, a.err)
	require.NoError(t, b.err)
	require.False(t, b.replayed)
	require.NotEqual(t, a.value, b.value)
	again := charge(withKey(t, "order-1"), dial(t, addr, grpc.WithAuthority("A.shop.test:443")), "tea")
	require.True(t, again.replayed)
	require.Equal(t, a.value, again.value)
	require.EqualValues(t, 2, svc.runs.Load())
}

func TestMethodsNotListedPassThrough(t *testing.T) {
	svc := newPayments()
	icpt := grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials(), grpcidem.WithMethods("/grpcidem.test.Payments/Refund"))
	conn := dial(t, serve(t, svc, icpt))
	for range 2 {
		require.NoError(t, charge(withKey(t, "order-1"), conn, "tea").err)
	}
	require.EqualValues(t, 2, svc.runs.Load())
}

// Streams are never replayed: with a key, and even with keys required, a
// streaming call runs every time and gets its own messages.
func TestStreamingCallsPassThrough(t *testing.T) {
	svc := newPayments()
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), grpcidem.WithCallerCredentials(), grpcidem.WithRequiredKey())))
	watch := func(ctx context.Context) (updates []string, replayed bool) {
		stream, err := conn.NewStream(ctx, &paymentsDesc.Streams[0], watchMethod)
		require.NoError(t, err)
		require.NoError(t, stream.SendMsg(wrapperspb.String("order-1")))
		require.NoError(t, stream.CloseSend())
		for {
			msg := new(wrapperspb.StringValue)
			if err := stream.RecvMsg(msg); err == io.EOF {
				break
			} else {
				require.NoError(t, err)
			}
			updates = append(updates, msg.GetValue())
		}
		header, err := stream.Header()
		require.NoError(t, err)
		return updates, len(header.Get(grpcidem.ReplayedHeader)) > 0
	}

	first, _ := watch(withKey(t, "order-1"))
	second, replayed := watch(withKey(t, "order-1"))
	withoutKey, _ := watch(t.Context())
	require.Equal(t, []string{"watch 1 update 0 of order-1", "watch 1 update 1 of order-1", "watch 1 update 2 of order-1"}, first)
	require.Equal(t, "watch 2 update 0 of order-1", second[0])
	require.Equal(t, "watch 3 update 0 of order-1", withoutKey[0])
	require.False(t, replayed)
	require.EqualValues(t, 3, svc.runs.Load())
}

// A method that returns a wrapped context error (a dependency's own
// deadline) is answered DEADLINE_EXCEEDED by grpc-go: that is the status
// stored, and the release policy applies to it. By default it is released,
// and the retry runs; stored, the retry gets DEADLINE_EXCEEDED, not UNKNOWN.
func TestWrappedContextErrorKeepsItsCode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy []grpcidem.Option
		runs   int64
	}{
		{"released by default", nil, 2},
		{"stored", []grpcidem.Option{grpcidem.WithErrorPolicy(func(*status.Status) bool { return true })}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := newPayments()
			conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(middleware(t), append(tc.policy, grpcidem.WithCallerCredentials())...)))
			first := charge(withKey(t, "order-1"), conn, "deadline")
			second := charge(withKey(t, "order-1"), conn, "deadline")
			require.Equal(t, codes.DeadlineExceeded, status.Code(first.err))
			require.Equal(t, codes.DeadlineExceeded, status.Code(second.err), "the retry's code is the caller's, never UNKNOWN")
			require.Equal(t, tc.runs, svc.runs.Load())
			require.Equal(t, tc.runs == 1, second.replayed)
		})
	}
}

// The interceptor's refusals reach the middleware's observer as Rejected,
// as Do's and a request's do: a missing required key, a malformed one, a
// caller the identity function does not know.
func TestRefusalsAreObserved(t *testing.T) {
	var mu sync.Mutex
	var outcomes []idempotency.Outcome
	m := middleware(t, idempotency.WithObserver(func(e idempotency.Event) {
		mu.Lock()
		outcomes = append(outcomes, e.Outcome)
		mu.Unlock()
	}))
	svc := newPayments()
	conn := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(m, grpcidem.WithRequiredKey(), grpcidem.WithCallerCredentials())))
	require.Equal(t, codes.InvalidArgument, status.Code(charge(t.Context(), conn, "a").err))
	twoKeys := metadata.AppendToOutgoingContext(t.Context(), grpcidem.DefaultMetadataKey, "k1", grpcidem.DefaultMetadataKey, "k2")
	require.Equal(t, codes.InvalidArgument, status.Code(charge(twoKeys, conn, "a").err))
	anonymous := dial(t, serve(t, svc, grpcidem.UnaryServerInterceptor(m, grpcidem.WithCallerIdentity(func(context.Context) (string, error) {
		return "", errors.New("no credentials")
	}))))
	require.Equal(t, codes.Unauthenticated, status.Code(charge(withKey(t, "k3"), anonymous, "a").err))
	require.Zero(t, svc.runs.Load())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []idempotency.Outcome{idempotency.Rejected, idempotency.Rejected, idempotency.Rejected}, outcomes)
}
