package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

type charge struct {
	Key       string
	Execution int64
	Fence     uint64
}

// twoInstances is two middlewares on one Redis, each with a client and a
// memory of its own, as two processes would be.
func twoInstances(t *testing.T, opts ...Option) (a, b *Middleware) {
	prefix := "test-" + strings.ReplaceAll(t.Name(), "/", "-")
	opts = append([]Option{WithKeyPrefix(prefix)}, opts...)
	return New(redistest.Client(t, prefix), opts...), New(redistest.Client(t, prefix), opts...)
}

// A thousand concurrent calls over a hundred keys, on two instances: each
// key's function runs once, and every call gets that run's result.
func TestDoRunsOncePerKeyAcrossInstances(t *testing.T) {
	a, b := twoInstances(t, WithWaitTimeout(20*time.Second))
	var runs atomic.Int64
	perKey := make([]atomic.Int64, 100)
	fn := func(key int) func(context.Context) (charge, error) {
		return func(ctx context.Context) (charge, error) {
			n := runs.Add(1)
			perKey[key].Add(1)
			time.Sleep(time.Millisecond) // long enough for duplicates to meet it
			fence := FencingToken(ctx)
			return charge{Key: fmt.Sprint(key), Execution: n, Fence: fence}, nil
		}
	}
	type got struct {
		key int
		c   charge
		err error
	}
	results := make(chan got, 1000)
	var wg sync.WaitGroup
	for i := range 1000 {
		m, key := a, i%100
		if i%2 == 1 {
			m = b
		}
		wg.Go(func() {
			c, err := Do(context.Background(), m, Key{Scope: "payments", ID: fmt.Sprint("msg-", key), Input: []byte("body")}, fn(key))
			results <- got{key, c, err}
		})
	}
	wg.Wait()
	close(results)

	first := map[int]charge{}
	for r := range results {
		require.NoError(t, r.err)
		if seen, ok := first[r.key]; ok {
			require.Equal(t, seen, r.c, "every call with the key gets the one result")
		} else {
			first[r.key] = r.c
		}
		require.NotZero(t, r.c.Fence, "the function saw its fencing token")
	}
	require.EqualValues(t, 100, runs.Load())
	for key := range perKey {
		require.EqualValues(t, 1, perKey[key].Load(), "key %d", key)
	}

	// The same key with other input is another call: refused, not answered.
	_, err := Do(context.Background(), b, Key{Scope: "payments", ID: "msg-7", Input: []byte("other body")}, fn(7))
	require.ErrorIs(t, err, ErrKeyReused)
	// Another scope's key of the same name is another key.
	_, err = Do(context.Background(), b, Key{Scope: "refunds", ID: "msg-7", Input: []byte("other body")}, fn(7))
	require.NoError(t, err)
	require.EqualValues(t, 101, runs.Load())
}

func TestDoErrors(t *testing.T) {
	m, other := twoInstances(t)
	ctx := context.Background()
	failing := errors.New("provider declined")
	runs := 0
	fail := func(context.Context) (int, error) { runs++; return 0, failing }

	t.Run("released by default", func(t *testing.T) {
		runs = 0
		k := Key{ID: "released"}
		_, err := Do(ctx, m, k, fail)
		require.ErrorIs(t, err, failing, "the first call gets the function's own error")
		_, err = Do(ctx, other, k, fail)
		require.ErrorIs(t, err, failing)
		require.Equal(t, 2, runs, "an error gives the key up: the retry ran again")
		v, err := Do(ctx, m, k, func(context.Context) (int, error) { return 42, nil })
		require.NoError(t, err)
		require.Equal(t, 42, v)
	})
	t.Run("stored", func(t *testing.T) {
		runs = 0
		k := Key{ID: "stored"}
		_, err := Do(ctx, m, k, fail, StoreErrors())
		require.ErrorIs(t, err, failing)
		_, err = Do(ctx, other, k, fail, StoreErrors())
		var stored *StoredError
		require.True(t, errors.As(err, &stored), "got %v", err)
		require.Equal(t, "provider declined", stored.Message)
		require.Equal(t, 1, runs)
	})
	t.Run("Release", func(t *testing.T) {
		k := Key{ID: "release"}
		n := 0
		fn := func(ctx context.Context) (int, error) {
			n++
			if n == 1 {
				require.True(t, Release(ctx))
			}
			return n, nil
		}
		v, err := Do(ctx, m, k, fn)
		require.NoError(t, err)
		require.Equal(t, 1, v)
		v, err = Do(ctx, other, k, fn)
		require.NoError(t, err)
		require.Equal(t, 2, v, "a released key runs again")
		v, err = Do(ctx, m, k, fn)
		require.NoError(t, err)
		require.Equal(t, 2, v)
	})
	t.Run("panic releases", func(t *testing.T) {
		k := Key{ID: "panic"}
		require.Panics(t, func() {
			Do(ctx, m, k, func(context.Context) (int, error) { panic("boom") })
		})
		v, err := Do(ctx, other, k, func(context.Context) (int, error) { return 7, nil })
		require.NoError(t, err)
		require.Equal(t, 7, v)
	})
	t.Run("bad keys", func(t *testing.T) {
		runs = 0
		_, err := Do(ctx, m, Key{}, fail)
		require.ErrorIs(t, err, ErrMissingKey)
		_, err = Do(ctx, m, Key{ID: "bad\nkey"}, fail)
		require.ErrorIs(t, err, ErrInvalidKey)
		require.Zero(t, runs, "neither ran")
	})
	t.Run("too big to replay", func(t *testing.T) {
		small, smallOther := twoInstances(t, WithMaxResponseBytes(16))
		big := func(context.Context) (string, error) { return strings.Repeat("x", 64), nil }
		v, err := Do(ctx, small, Key{ID: "big"}, big)
		require.NoError(t, err)
		require.Len(t, v, 64, "the first call gets its result whatever its size")
		_, err = Do(ctx, smallOther, Key{ID: "big"}, big)
		require.ErrorIs(t, err, ErrNotReplayable)
	})
	t.Run("store down", func(t *testing.T) {
		// Nothing listens on port 1 of loopback.
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
		defer rdb.Close()
		down := New(rdb, WithStoreTimeout(200*time.Millisecond))
		ran := false
		_, err := Do(ctx, down, Key{ID: "k"}, func(context.Context) (int, error) { ran = true; return 1, nil })
		require.ErrorIs(t, err, ErrStoreUnavailable)
		require.False(t, ran)
	})
}

// A duplicate that arrives while the first call runs waits for its result,
// on the same instance or another; one that gives up gets its context's
// error, and the first call still finishes and stores its result.
func TestDoWaitsForTheRunningCall(t *testing.T) {
	m, other := twoInstances(t)
	entered, finish := make(chan struct{}), make(chan struct{})
	slow := func(context.Context) (string, error) {
		close(entered)
		<-finish
		return "done", nil
	}
	k := Key{ID: "slow", Input: []byte("x")}
	firstDone := make(chan error, 1)
	go func() {
		_, err := Do(context.Background(), m, k, slow)
		firstDone <- err
	}()
	<-entered
	impatient, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := Do(impatient, other, k, slow)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	waiters := make(chan string, 2)
	for _, inst := range []*Middleware{m, other} {
		go func() {
			v, err := Do(context.Background(), inst, k, slow)
			if err != nil {
				v = err.Error()
			}
			waiters <- v
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(finish)
	require.NoError(t, <-firstDone)
	require.Equal(t, "done", <-waiters)
	require.Equal(t, "done", <-waiters)
}

// ReportOutcome tells a run from a replay and from a refusal.
func TestDoReportsItsOutcome(t *testing.T) {
	m, other := twoInstances(t)
	fn := func(context.Context) (int, error) { return 1, nil }
	var o Outcome
	_, err := Do(context.Background(), m, Key{ID: "k", Input: []byte("a")}, fn, ReportOutcome(&o))
	require.NoError(t, err)
	require.Equal(t, Executed, o)
	_, err = Do(context.Background(), other, Key{ID: "k", Input: []byte("a")}, fn, ReportOutcome(&o))
	require.NoError(t, err)
	require.Equal(t, Replayed, o)
	_, err = Do(context.Background(), other, Key{ID: "k", Input: []byte("b")}, fn, ReportOutcome(&o))
	require.ErrorIs(t, err, ErrKeyReused)
	require.Equal(t, Rejected, o, "a reused key is refused like a 422")
}

// A Codec of the caller's stores the result; one that gives a result
// back changed is refused, as JSON is (see CheckResult).
func TestDoCodec(t *testing.T) {
	m, other := twoInstances(t)
	calls := 0
	fn := func(context.Context) (string, error) { calls++; return "plain", nil }
	v, err := Do(context.Background(), m, Key{ID: "k"}, fn, UseCodec(reverseCodec{}))
	require.NoError(t, err)
	require.Equal(t, "plain", v)
	rec, err := redistest.ReadRecord(context.Background(), m.redis.client, functionKeys(m, "k").record)
	require.NoError(t, err)
	require.Equal(t, "nialp", rec.Body, "the result went through the codec")
	v, err = Do(context.Background(), other, Key{ID: "k"}, fn, UseCodec(reverseCodec{}))
	require.NoError(t, err)
	require.Equal(t, "plain", v)
	require.Equal(t, 1, calls)

	v, err = Do(context.Background(), m, Key{ID: "upper"}, fn, UseCodec(upperCodec{}))
	require.ErrorIs(t, err, ErrNotReplayable, "a codec that changes the result")
	require.Equal(t, "plain", v)
}

// reverseCodec stores a string backwards, and reads it back.
type reverseCodec struct{}

func (reverseCodec) Marshal(v any) ([]byte, error) {
	b := []byte(v.(string))
	slices.Reverse(b)
	return b, nil
}

func (reverseCodec) Unmarshal(data []byte, v any) error {
	b := slices.Clone(data)
	slices.Reverse(b)
	*v.(*string) = string(b)
	return nil
}

// upperCodec gives a string back in upper case: not what it was given.
type upperCodec struct{}

func (upperCodec) Marshal(v any) ([]byte, error) { return []byte(strings.ToUpper(v.(string))), nil }
func (upperCodec) Unmarshal(data []byte, v any) error {
	*v.(*string) = string(data)
	return nil
}

// Under WithFailOpen a Redis that does not answer lets the function run,
// unprotected, rather than fail the call.
func TestDoFailsOpenWhenAsked(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	m := New(rdb, WithStoreTimeout(200*time.Millisecond), WithFailOpen())
	var o Outcome
	v, err := Do(context.Background(), m, Key{ID: "k"}, func(context.Context) (int, error) { return 5, nil }, ReportOutcome(&o))
	require.NoError(t, err)
	require.Equal(t, 5, v)
	require.Equal(t, Executed, o)
}

// A result the codec cannot encode is not stored, and its key is not given
// up either: fn ran, so a duplicate is told it cannot have the result, and
// the first call is told so too, with the result.
func TestDoResultThatCannotBeEncoded(t *testing.T) {
	m, other := twoInstances(t)
	runs := 0
	fn := func(context.Context) (func(), error) { runs++; return func() {}, nil } // JSON cannot encode a func
	v, err := Do(context.Background(), m, Key{ID: "k"}, fn)
	require.ErrorIs(t, err, ErrNotReplayable, "the run succeeded; that its result cannot be stored is said at once")
	require.NotNil(t, v, "the first call gets the result all the same")
	_, err = Do(context.Background(), other, Key{ID: "k"}, fn)
	require.ErrorIs(t, err, ErrNotReplayable)
	require.Equal(t, 1, runs)
}

// Function calls and requests never share a key, even when a WithScope
// function names the same scope the function call does.
func TestDoKeysNeverMeetRequestKeys(t *testing.T) {
	prefix := "test-" + t.Name()
	m := New(redistest.Client(t, prefix), WithKeyPrefix(prefix), WithCallerCredentials(),
		WithScope(func(r *http.Request) (string, error) { return r.Header.Get("Tenant"), nil }))
	h := m.ProtectKey(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	for _, tenant := range []string{"orders", "f:orders"} { // the second is what a Do scope once became
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
		r.Header.Set(KeyHeader, "msg-1")
		r.Header.Set("Tenant", tenant)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusCreated, w.Code)
	}
	for _, scope := range []string{"orders", "f:orders"} {
		v, err := Do(context.Background(), m, Key{Scope: scope, ID: "msg-1", Input: []byte("other")},
			func(context.Context) (string, error) { return "ran", nil })
		require.NoError(t, err)
		require.Equal(t, "ran", v)
	}
}

// Calls that cannot reach Redis leave a bounded number of undos behind,
// not one goroutine per call.
func TestDoAgainstAnUnreachableRedisLeavesFewGoroutines(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	m := New(rdb, WithStoreTimeout(100*time.Millisecond), WithLockLease(500*time.Millisecond),
		WithLogger(slog.New(slog.DiscardHandler)))
	before := runtime.NumGoroutine()
	errs := make(chan error, 300)
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Go(func() {
			_, err := Do(context.Background(), m, Key{ID: fmt.Sprint("k", i)}, func(context.Context) (int, error) { return 1, nil })
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.ErrorIs(t, err, ErrStoreUnavailable)
	}
	// Undos retry for a lease (500 ms), so most are still there: queued,
	// worked by at most undoWorkers (32) goroutines, plus go-redis's own
	// dialling.
	require.Less(t, runtime.NumGoroutine(), before+100, "a goroutine per call would leave 300")
}

// A codec that panics after fn ran must neither run fn again nor keep the
// key locked for ever: the lease ends, and a duplicate finds the run
// interrupted.
func TestDoPanicAfterTheRunEndsTheLease(t *testing.T) {
	m, other := twoInstances(t, WithLockLease(300*time.Millisecond), WithStoreTimeout(100*time.Millisecond))
	runs := 0
	fn := func(context.Context) (string, error) { runs++; return "x", nil }
	require.Panics(t, func() { Do(context.Background(), m, Key{ID: "k"}, fn, UseCodec(panickyCodec{})) })
	time.Sleep(400 * time.Millisecond) // past the lease, had nobody renewed it
	_, err := Do(context.Background(), other, Key{ID: "k"}, fn)
	require.ErrorIs(t, err, ErrInterrupted)
	require.Equal(t, 1, runs)
}

type panickyCodec struct{}

func (panickyCodec) Marshal(any) ([]byte, error) { panic("codec bug") }
func (panickyCodec) Unmarshal([]byte, any) error { return nil }

// Every queued release is done, however many arrive at once: none is dropped
// while the queue has room.
func TestEveryQueuedUndoIsDone(t *testing.T) {
	prefix := "test-" + t.Name()
	rdb := redistest.Client(t, prefix)
	m := New(rdb, WithKeyPrefix(prefix))
	var claimed []keys
	var values []string
	for i := range 200 {
		c := &call{ctx: context.Background(), scope: "s", key: fmt.Sprint("k", i)}
		c.id = identityOfKind('f', c.scope, c.key)
		k := m.redisKeys(c)
		lock, err := newTestLock()
		require.NoError(t, err)
		cl, err := m.redis.claim(context.Background(), k, lock.Value(), "fp")
		require.NoError(t, err)
		require.Equal(t, outcomeClaimed, cl.outcome)
		claimed, values = append(claimed, k), append(values, lock.Value())
	}
	for i, k := range claimed {
		(&lease{m: m, k: k, lockValue: values[i]}).releaseLater()
	}
	require.Eventually(t, func() bool {
		for _, k := range claimed {
			if rdb.Exists(context.Background(), k.record).Val() == 1 {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "every claim undone")
}
