package idempotency

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/redistest"
)

// recheckSecret makes m ask Redis for the shared secret now, as it does
// every secretRecheck, and waits for the answer.
func recheckSecret(t *testing.T, m *Middleware) {
	t.Helper()
	s := m.tokens
	s.mu.Lock()
	s.checked, s.failed = time.Time{}, time.Time{}
	s.mu.Unlock()
	_, err := s.key(t.Context())
	require.NoError(t, err)
	s.mu.Lock()
	loading := s.loading
	s.mu.Unlock()
	if loading != nil {
		<-loading
	}
}

// overwriteSecret replaces the fleet's shared secret in Redis, as an
// operator does to revoke every token out.
func overwriteSecret(t *testing.T, s *shop, secret string) {
	t.Helper()
	require.NoError(t, s.rdb.Set(t.Context(), s.idem.cfg.prefix+":token-secret", secret, 0).Err())
}

func secretIn(t *testing.T, m *Middleware) string {
	t.Helper()
	secret, err := m.store.client.Get(t.Context(), m.cfg.prefix+":token-secret").Result()
	require.NoError(t, err)
	return secret
}

// Redis restarts without persistence while a form is being submitted: the
// submission in the window runs once, and its resubmission, after the
// instance has asked Redis for the secret again, is the replay of that
// order, not "token not found" (the form would ask for a new token, and
// the user would order twice). The spend itself writes back the secret
// the instance holds, before any recheck, so a new instance started right
// after signs and checks with it too, and finds the record, even if the
// first one stopped.
func TestARedisRestartKeepsTheTokenSecret(t *testing.T) {
	srv := redistest.Private(t)
	s := newShopOn(t, srv.Client(t), WithStoreTimeout(500*time.Millisecond))
	c := s.client()
	tok := s.token(c)
	before := secretIn(t, s.idem)

	require.NoError(t, srv.Signal(syscall.SIGKILL))
	redistest.Restart(t, srv)
	first := waitFor201(t, s, c, tok)
	require.Equal(t, before, secretIn(t, s.idem), "the spend wrote the secret back")

	fresh := newShopOn(t, srv.Client(t), WithKeyPrefix(s.idem.cfg.prefix))
	got, err := fresh.idem.tokens.check(t.Context(), sessionOf(t, s, c), tok)
	require.NoError(t, err)
	require.Equal(t, tokenValid, got.state, "a new instance reads the same secret")
	again := fresh.post(c, "/orders", tok, `{}`)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.Equal(t, first.body, again.body)

	recheckSecret(t, s.idem)
	again = s.post(c, "/orders", tok, `{}`)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load()+fresh.execs.Load())
}

// waitFor201 posts tok until Redis, just restarted, takes the claim.
func waitFor201(t *testing.T, s *shop, c *http.Client, tok string) answer {
	t.Helper()
	var a answer
	require.Eventually(t, func() bool {
		a = s.post(c, "/orders", tok, `{}`)
		return a.status != http.StatusServiceUnavailable
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusCreated, a.status, a.body)
	return a
}

// An operator overwrites the shared secret to revoke the tokens out. The
// instance adopts the new secret: a token of the old one that was never
// spent is refused and runs nothing, and one that was spent still gets its
// answer replayed.
func TestARetiredSecretStillReplaysSpentTokens(t *testing.T) {
	s := newShop(t)
	c := s.client()
	spent, unspent := s.token(c), s.token(c)
	first := s.post(c, "/orders", spent, `{}`)
	require.Equal(t, http.StatusCreated, first.status)

	overwriteSecret(t, s, "an operator's new secret, 32 bytes at least")
	recheckSecret(t, s.idem)

	again := s.post(c, "/orders", spent, `{}`)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.Equal(t, first.body, again.body)
	requireProblem(t, s.post(c, "/orders", unspent, `{}`), 422, "token-not-found")
	require.EqualValues(t, 1, s.execs.Load())

	fresh := s.token(c)
	require.Equal(t, http.StatusCreated, s.post(c, "/orders", fresh, `{}`).status, "new tokens work")
	require.EqualValues(t, 2, s.execs.Load())
}

// While Redis stalls, issuing tokens answers from the secret in memory: the
// recheck that falls due goes on in the background, once, and its failure
// is remembered instead of being retried by every request.
func TestIssuingNeverWaitsOnAStalledRedis(t *testing.T) {
	srv := redistest.Private(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	rdb := clientTo(t, proxy.Addr())
	m := New(rdb, WithKeyPrefix("test-stall"), WithStoreTimeout(2*time.Second))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	_, err := m.IssueTokenFor(r, "s")
	require.NoError(t, err)

	proxy.StartBlackhole()
	defer proxy.EndBlackhole()
	m.tokens.mu.Lock()
	m.tokens.checked = time.Time{} // the recheck is due
	m.tokens.mu.Unlock()
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_, err := m.IssueTokenFor(r, "s")
			require.NoError(t, err)
		})
	}
	wg.Wait()
	require.Less(t, time.Since(start), time.Second, "8 tokens issued while the recheck waits on Redis (2 s)")

	require.Eventually(t, func() bool {
		m.tokens.mu.Lock()
		defer m.tokens.mu.Unlock()
		return !m.tokens.failed.IsZero()
	}, 10*time.Second, 10*time.Millisecond, "the recheck fails once the store timeout passes")
	_, err = m.IssueTokenFor(r, "s")
	require.NoError(t, err)
	m.tokens.mu.Lock()
	defer m.tokens.mu.Unlock()
	require.Nil(t, m.tokens.loading, "a failed recheck is not retried at once")
}

// A new instance reads the shared secret with a read: Redis at maxmemory
// under noeviction refuses writes, and the instance still issues tokens.
func TestANewInstanceIssuesWhileRedisIsFull(t *testing.T) {
	srv := redistest.Private(t)
	rdb := srv.Client(t)
	old := New(rdb, WithKeyPrefix("test-full"))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	_, err := old.IssueTokenFor(r, "s")
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", "1").Err())
	require.Error(t, rdb.Set(ctx, "test-full:probe", "x", 0).Err(), "Redis refuses writes")

	fresh := New(rdb, WithKeyPrefix("test-full"))
	tok, err := fresh.IssueTokenFor(r, "s")
	require.NoError(t, err)
	got, err := old.tokens.check(ctx, "s", tok.Value)
	require.NoError(t, err)
	require.Equal(t, tokenValid, got.state)
}

// An operator overwrites the shared secret to revoke the tokens out. A
// token spent before it replays on an instance that never held the old
// secret too, once the instance that held it has rechecked: the retired
// secret is the fleet's, in Redis, not only the instance's that held it.
func TestANewInstanceReplaysATokenOfTheSecretItNeverHeld(t *testing.T) {
	old := newShop(t)
	c := old.client()
	tok := old.token(c)
	first := old.post(c, "/orders", tok, `{}`)
	require.Equal(t, http.StatusCreated, first.status, first.body)

	overwriteSecret(t, old, "an operator's new secret, 32 bytes at least")
	recheckSecret(t, old.idem) // old adopts the new secret and retires its own
	fresh := newShopOn(t, old.rdb, WithKeyPrefix(old.idem.cfg.prefix))
	again := fresh.post(c, "/orders", tok, `{}`)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get(ReplayedHeader))
	require.Equal(t, first.body, again.body)
	require.EqualValues(t, 1, old.execs.Load())
	require.Zero(t, fresh.execs.Load())
}

// An operator replaces the shared secret again and again (each a
// revocation of every token out), and a token was spent under each secret.
// However many secrets came and went, each token replays on every
// instance, a new one included, as long as its record lives: told
// token-not-found, its form would ask for a new token and order again.
func TestSpentTokensReplayHoweverOftenTheSecretIsReplaced(t *testing.T) {
	a := newShop(t)
	b := newShopOn(t, a.rdb, WithKeyPrefix(a.idem.cfg.prefix))
	c := a.client()
	spent := map[string]answer{}
	for i := range 20 {
		tok := a.token(c)
		first := a.post(c, "/orders", tok, `{}`)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		spent[tok] = first
		overwriteSecret(t, a, fmt.Sprintf("an operator's secret number %d, 32 bytes at least", i))
		recheckSecret(t, a.idem)
		recheckSecret(t, b.idem)
	}

	fresh := newShopOn(t, a.rdb, WithKeyPrefix(a.idem.cfg.prefix))
	for name, s := range map[string]*shop{"the instance that spent them": a, "another": b, "a new one": fresh} {
		for tok, first := range spent {
			again := s.post(c, "/orders", tok, `{}`)
			require.Equal(t, http.StatusCreated, again.status, "%s: %s", name, again.body)
			require.Equal(t, "true", again.header.Get(ReplayedHeader), name)
			require.Equal(t, first.body, again.body, name)
		}
	}
	require.EqualValues(t, 20, a.execs.Load()+b.execs.Load()+fresh.execs.Load())
}

// A retired secret is kept as long as a record of a token it signed may
// live, and no longer: the fleet's set only holds the secrets that can
// still find a record, which a forged token is checked against.
func TestARetiredSecretIsKeptAsLongAsItsRecords(t *testing.T) {
	m := New(redistest.Client(t, "test-keep-retired"), WithKeyPrefix("test-keep-retired"))
	s := m.tokens
	name := "test-keep-retired:token-secret:retired"
	long := []byte("a secret retired too long ago, 32 bytes at least")
	recent := []byte("a secret retired a while ago, 32 bytes at least")
	ctx := t.Context()
	require.NoError(t, m.store.client.ZAdd(ctx, name,
		redis.Z{Score: float64(time.Now().Add(-s.keepRetired - time.Minute).UnixMilli()), Member: long},
		redis.Z{Score: float64(time.Now().Add(-s.keepRetired + time.Minute).UnixMilli()), Member: recent},
	).Err())
	loaded := s.loadRetired()
	require.Len(t, loaded, 1, "a secret past its records is not loaded")
	require.Equal(t, recent, loaded[0].secret)

	now := []byte("a secret retired just now, 32 bytes at least")
	require.NoError(t, s.record(ctx, now))
	kept, err := m.store.client.ZRange(ctx, name, 0, -1).Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{string(recent), string(now)}, kept, "recording drops what is past")
	ttl, err := m.store.client.PTTL(ctx, name).Result()
	require.NoError(t, err)
	require.InDelta(t, s.keepRetired, ttl, float64(time.Minute))
}

// Redis restarts empty, and a new instance makes a new secret before the
// running one writes its own back. The running one then takes a
// submission of a token of its secret, and may stop (a rolling deploy)
// before its recheck would adopt the new secret and retire its own in
// Redis. Were the token spent, no instance could find its record: a retry
// would be told token-not-found, and a form that then asks for a new token
// would order again. So the claim confirms the secret first: the fleet no
// longer keeps it, the claim is given back and nothing runs; the instance
// adopts the new secret at once, and the form's next token runs once. A
// secret of the application's own (WithTokenSecret) cannot move.
func TestATokenIsNotSpentUnderASecretTheFleetLost(t *testing.T) {
	for _, own := range []bool{false, true} {
		t.Run(map[bool]string{false: "shared secret", true: "WithTokenSecret"}[own], func(t *testing.T) {
			srv := redistest.Private(t)
			opts := []Option{WithKeyPrefix("gone"), WithStoreTimeout(500 * time.Millisecond)}
			if own {
				opts = append(opts, WithTokenSecret([]byte("the application's own secret, 32 bytes or more")))
			}
			old := newShopOn(t, srv.Client(t), opts...)
			c := old.client()
			tok := old.token(c) // old holds its secret
			held := secretOf(old.idem)

			require.NoError(t, srv.Signal(syscall.SIGKILL))
			srv = redistest.Restart(t, srv)
			fresh := newShopOn(t, srv.Client(t), opts...)
			fresh.token(fresh.client()) // the restarted Redis takes fresh's new secret, if shared
			var first answer
			require.Eventually(t, func() bool {
				first = old.post(c, "/orders", tok, `{}`)
				return first.status != http.StatusServiceUnavailable
			}, 10*time.Second, 20*time.Millisecond)
			if own {
				require.Equal(t, http.StatusCreated, first.status, first.body)
				again := fresh.post(c, "/orders", tok, `{}`)
				require.Equal(t, http.StatusCreated, again.status, again.body)
				require.Equal(t, "true", again.header.Get(ReplayedHeader))
				require.Equal(t, first.body, again.body)
				return
			}
			requireProblem(t, first, http.StatusUnprocessableEntity, "token-not-found")
			require.Zero(t, old.execs.Load(), "nothing ran under the lost secret")
			n, err := old.rdb.Exists(t.Context(), tokenKeys("gone", sessionOf(t, old, c), tok).record).Result()
			require.NoError(t, err)
			require.Zero(t, n, "the claim was given back")

			// old took the fleet's secret before it answered: the form's next
			// token, asked for while Redis stalls (so no read could help), is
			// the fleet's, and runs once, whichever instance takes it.
			require.NoError(t, srv.Signal(syscall.SIGSTOP))
			next := old.token(c)
			require.NoError(t, srv.Signal(syscall.SIGCONT))
			require.Equal(t, secretIn(t, fresh.idem), secretOf(old.idem))
			ordered := fresh.post(c, "/orders", next, `{}`)
			require.Equal(t, http.StatusCreated, ordered.status, ordered.body)
			again := old.post(c, "/orders", next, `{}`)
			require.Equal(t, http.StatusCreated, again.status, again.body)
			require.Equal(t, "true", again.header.Get(ReplayedHeader))
			require.EqualValues(t, 1, fresh.execs.Load()+old.execs.Load())
			// and retired its own in Redis, where the fleet looks spent
			// tokens up.
			require.Eventually(t, func() bool {
				_, err := old.rdb.ZScore(t.Context(), "gone:token-secret:retired", held).Result()
				return err == nil
			}, 5*time.Second, 10*time.Millisecond)
		})
	}
}

// secretOf is the secret m holds.
func secretOf(m *Middleware) string {
	m.tokens.mu.Lock()
	defer m.tokens.mu.Unlock()
	return string(m.tokens.secret)
}
