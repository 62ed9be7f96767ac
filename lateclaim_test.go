package idempotency

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// beforeCommand runs do before every command that match picks: a slow
// script, a lagging replica, a lock taken away.
type beforeCommand struct {
	match func(redis.Cmder) bool
	do    func(context.Context)
}

func (beforeCommand) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h beforeCommand) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, h.match) {
			h.do(ctx)
		}
		return next(ctx, cmds)
	}
}

func (h beforeCommand) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) {
			h.do(ctx)
		}
		return next(ctx, cmd)
	}
}

// signalThenSleep tells entered, without blocking, and then stalls for d.
func signalThenSleep(entered chan<- struct{}, d time.Duration) func(context.Context) {
	return func(context.Context) {
		select {
		case entered <- struct{}{}:
		default:
		}
		time.Sleep(d)
	}
}

// duplicateDuringSlowStep sends a request to a whose Redis stalls it in one
// step (entered says when), and the same request to b once the stall has
// lasted past; it returns both answers.
func duplicateDuringSlowStep(t *testing.T, a, b *shop, entered <-chan struct{}, past time.Duration) (first, dup answer) {
	t.Helper()
	c := a.client()
	done := a.postAsync(c, "/payments", "slow-step", `{}`)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled step never came: its hook matches nothing")
	}
	time.Sleep(past)
	dup = b.post(c, "/payments", "slow-step", `{}`)
	return (<-done).must(t), dup
}

// The claim takes the lock in one script (claim.lua), so no pause can fall
// between the two. What can be slow is their reply: one that comes
// back after the whole lease lets the key go to a duplicate on another
// instance, and then the slow request must not start its handler. It
// answers 503, and its retry gets the duplicate's answer: one execution.
func TestLockAndClaimReplySlowerThanTheLease(t *testing.T) {
	prefix := "test-" + t.Name()
	slow, claiming := slowClaimReplies(t, prefix, 700*time.Millisecond)
	opts := []Option{WithKeyPrefix(prefix), WithLockLease(300 * time.Millisecond),
		WithStoreTimeout(2 * time.Second), WithRetryAbandoned()}
	a := newShopOn(t, slow, opts...)
	b := newShopOn(t, redistest.Client(t, prefix), opts...)
	warmScripts(t, prefix)
	// Past the lease, while the reply is on its way.
	first, dup := duplicateDuringSlowStep(t, a, b, claiming, 400*time.Millisecond)
	require.Equal(t, http.StatusCreated, dup.status)
	require.Equal(t, http.StatusServiceUnavailable, first.status, first.body)
	require.Zero(t, a.execs.Load(), "the slow request lost the key before its handler started")
	require.EqualValues(t, 1, b.execs.Load())
	retry := a.post(a.client(), "/payments", "slow-step", `{}`)
	require.Equal(t, http.StatusCreated, retry.status)
	require.Equal(t, dup.body, retry.body)
}

// A reply that comes back late, but within the lease, leaves the lock ours
// for less than the rest of its lease: the first renewal is due at once,
// not a third of a lease later, so the lock never runs out under a
// handler that started on it, and a duplicate on another instance waits.
func TestLockRenewedAtOnceAfterALateReply(t *testing.T) {
	prefix := "test-" + t.Name()
	slow, claiming := slowClaimReplies(t, prefix, 420*time.Millisecond) // 0.7 of the lease
	opts := []Option{WithKeyPrefix(prefix), WithLockLease(600 * time.Millisecond),
		WithStoreTimeout(2 * time.Second), WithRetryAbandoned()}
	a := newShopOn(t, slow, opts...)
	b := newShopOn(t, redistest.Client(t, prefix), opts...)
	warmScripts(t, prefix)
	a.handler = func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(600 * time.Millisecond) // past where the lock ran out unrenewed
		a.defaultHandler(w, r)
	}
	first, dup := duplicateDuringSlowStep(t, a, b, claiming, 800*time.Millisecond)
	require.Equal(t, http.StatusCreated, first.status, first.body)
	require.Equal(t, http.StatusCreated, dup.status, dup.body)
	require.Equal(t, first.body, dup.body)
	require.EqualValues(t, 1, a.execs.Load())
	require.Zero(t, b.execs.Load(), "the duplicate found the key held, not abandoned")
}

// slowClaimReplies is a client whose replies to the lock-and-claim
// pipeline come back d late; claiming says when the first such reply came.
func slowClaimReplies(t *testing.T, prefix string, d time.Duration) (*redis.Client, <-chan struct{}) {
	slow := redistest.Client(t, prefix).(*redis.Client)
	claiming := make(chan struct{}, 1)
	slow.AddHook(afterReply{
		match: func(cmd redis.Cmder) bool {
			args := cmd.Args()
			return len(args) > 1 && (args[1] == claimScript.Hash() || args[1] == claimSource)
		},
		do: signalThenSleep(claiming, d),
	})
	return slow, claiming
}

// warmScripts has the test's Redis load the scripts, through a shop of its
// own, so that a stalled step of the test stalls once, not again for a
// NOSCRIPT resend.
func warmScripts(t *testing.T, prefix string) {
	t.Helper()
	s := newShopOn(t, redistest.Client(t, prefix), WithKeyPrefix(prefix))
	require.Equal(t, http.StatusCreated, s.post(s.client(), "/payments", "warm-scripts", `{}`).status)
}

// afterReply runs do once a matching command, alone or in a pipeline,
// has had its reply: a reply that is slow to arrive.
type afterReply beforeCommand

func (afterReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h afterReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.match(cmd) {
			h.do(ctx)
		}
		return err
	}
}

func (h afterReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if slices.ContainsFunc(cmds, h.match) {
			h.do(ctx)
		}
		return err
	}
}
