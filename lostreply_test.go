package idempotency

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Lost replies, through a real TCP proxy: the reply to the claim (and, in
// other trials, to the store step or the lock) is dropped after Redis ran
// the command, go-redis resends it on a new connection, and still no key
// runs twice and none is left undecided.
func TestLostRepliesTrials(t *testing.T) {
	srv := redistest.Private(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	rdb := clientTo(t, proxy.Addr())
	direct := srv.Client(t)

	h := newCounting(0)
	m := New(rdb, WithKeyPrefix("lost"), WithCallerCredentials()).ProtectKey(h)
	send(m, "warm-up", `{}`) // loads every script, so each trial's commands are EVALSHA

	steps := map[string]string{"claim": claimScript.Hash(), "complete": completeScript.Hash()}
	n := trials(200, 1000)
	for _, step := range []string{"claim", "complete"} {
		t.Run(step, func(t *testing.T) {
			before := proxy.Dropped()
			firsts := map[int]int{}
			for trial := range n {
				key := fmt.Sprintf("%s-%d", step, trial)
				proxy.DropNextReply(steps[step])
				first := send(m, key, `{}`)
				require.Contains(t, []int{http.StatusCreated, http.StatusServiceUnavailable}, first.Code, first.Body.String())
				firsts[first.Code]++
				// Whatever the first answer, the key is decided: a retry
				// replays the one execution, or runs it if none happened.
				retry := send(m, key, `{}`)
				require.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
				st := redistest.RecordState(context.Background(), direct, clientKeys("lost", routeIdentity("example.com", "/payments", key)).record)
				require.Equal(t, "done", st)
			}
			require.Empty(t, h.doubles())
			t.Logf("%d replies to %s dropped after Redis ran it: first answers %v, 0 double executions, every key decided",
				proxy.Dropped()-before, step, firsts)
			require.GreaterOrEqual(t, proxy.Dropped()-before, int64(n))
		})
	}
}
