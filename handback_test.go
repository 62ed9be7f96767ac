package idempotency

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/redistest"
)

// A takeover can itself be taken over, and each claim whose reply was lost
// is undone whenever the store hears the undo: late, after the takeover
// of it was undone and handed the key back to it. The record names one
// previous owner, so that undo finds nobody to hand the key on to. It must
// not free the key: the first run's journal would go with the record, and
// a fresh claim would do its steps again (and, with an outcome store, skip
// the recovery of what it committed). The next claim resumes the first
// run, in either order of the undos, in Redis and in an SQL row alike.
func TestUndoneTakeoversKeepTheFirstRunsJournal(t *testing.T) {
	for _, store := range chainStores {
		for _, undo := range [][2]string{{"taker-of-taker", "taker"}, {"taker", "taker-of-taker"}} {
			t.Run(store.name+"/"+undo[0]+" first", func(t *testing.T) {
				s := store.open(t)
				require.Equal(t, "claimed", s.claim("first").word)
				s.journal("first", chainEntry)
				s.crash()
				for _, owner := range []string{"taker", "taker-of-taker"} {
					found := s.claim(owner)
					require.Equal(t, "claimed", found.word, owner)
					require.True(t, found.retaken, owner)
					require.Equal(t, chainEntry, found.journal, "%s resumes the first run", owner)
					s.crash() // its claim's reply was lost: it never ran
				}
				s.release(undo[0])
				s.release(undo[1])
				found := s.claim("retry")
				require.Equal(t, "claimed", found.word)
				require.True(t, found.retaken, "the retry resumes the first run, not a fresh claim")
				require.Equal(t, chainEntry, found.journal, "the first run's journal survives both undos")
			})
		}
	}
}

// A release undoes only the claim it names: an executor's late release,
// after its key went on to another run (a takeover, or a fresh claim once
// the record was settled), changes nothing of that run, whatever the
// record holds, in Redis and in an SQL row alike.
func TestAReleaseOfAnotherExecutorsRunChangesNothing(t *testing.T) {
	for _, store := range chainStores {
		for _, shape := range []string{"fresh claim", "journaled", "takeover"} {
			t.Run(store.name+"/"+shape, func(t *testing.T) {
				s := store.open(t)
				owner := "owner"
				require.Equal(t, "claimed", s.claim(owner).word)
				switch shape {
				case "journaled":
					s.journal(owner, chainEntry)
				case "takeover":
					s.journal(owner, chainEntry)
					s.crash()
					owner = "taker"
					require.True(t, s.claim(owner).retaken)
				}
				s.release("stale")
				found := s.claim(owner) // the run's own claim, resent: still its own
				require.Equal(t, "claimed", found.word, "the run still owns its key")
				require.Equal(t, shape == "takeover", found.retaken)
				s.crash()
				found = s.claim("next")
				require.Equal(t, "claimed", found.word)
				require.True(t, found.retaken, "the run's record is still there to take over")
				if shape != "fresh claim" {
					require.Equal(t, chainEntry, found.journal, "with its journal")
				}
			})
		}
	}
}

// chainStores are the stores a takeoverChain drives; chainEntry the step
// journaled in them.
var (
	chainStores = []struct {
		name string
		open func(t *testing.T) takeoverChain
	}{
		{"redis", openRedisChain},
		{"sql row", openRowChain},
	}
	chainEntry = string(appendEntry(nil, entryResult, "charge", []byte(`{"id":"ch_1"}`)))
)

// takeoverChain is one key in a store that takes runs over at once
// (WithRetryAbandoned), driven claim by claim.
type takeoverChain interface {
	claim(owner string) claimFound
	journal(owner, entry string)
	crash() // the lease lapses: its owner stopped renewing it
	release(owner string)
}

type redisChain struct {
	t *testing.T
	m *Middleware
	k keys
}

func openRedisChain(t *testing.T) takeoverChain {
	rdb := redistest.Client(t, "handback")
	m := New(rdb, WithKeyPrefix("handback"), WithLockLease(time.Minute), WithRetryAbandoned(), WithResume())
	return &redisChain{t, m, functionKeys(m, t.Name())}
}

func (c *redisChain) claim(owner string) claimFound {
	cl, err := c.m.redis.claim(c.t.Context(), c.k, owner, goldenFP)
	require.NoError(c.t, err)
	found := claimFound{word: "other", retaken: cl.retaken}
	if cl.outcome == outcomeClaimed {
		found.word = "claimed"
	}
	if cl.journal != nil {
		found.journal = *cl.journal
	}
	return found
}

func (c *redisChain) journal(owner, entry string) {
	proof, err := c.m.redis.journal(c.t.Context(), c.k, owner, []byte(entry), 0)
	require.NoError(c.t, err)
	require.Equal(c.t, 1, proof.owned)
}

func (c *redisChain) crash() {
	require.NoError(c.t, c.m.redis.client.Del(c.t.Context(), c.k.lock).Err())
}

func (c *redisChain) release(owner string) {
	require.NoError(c.t, c.m.redis.release(c.t.Context(), c.k, owner))
}

type rowChain struct {
	t *testing.T
	r *keyRow
}

func openRowChain(t *testing.T) takeoverChain { return &rowChain{t, &keyRow{}} }

func (c *rowChain) claim(owner string) claimFound {
	c.r.now = time.Now().UnixMicro()
	return c.r.claim(claimAsk{lockValue: owner, fingerprint: goldenFP, abandoned: "1",
		life: time.Hour.Microseconds(), horizon: time.Minute.Microseconds(), lease: time.Minute.Microseconds()})
}

func (c *rowChain) journal(owner, entry string) {
	owned, _ := c.r.step(owner, entry, 0, 0)
	require.Equal(c.t, 1, owned)
}

func (c *rowChain) crash() { c.r.holder, c.r.holderUntil = "", 0 }

func (c *rowChain) release(owner string) { c.r.release(owner) }
