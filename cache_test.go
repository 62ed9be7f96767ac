package idempotency

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestResponseCacheBounds(t *testing.T) {
	now := time.Now()
	rec := func(n int) *record { return newRecord(200, nil, make([]byte, n)) }
	id := func(i byte) identity { return identity{i} }

	c := newResponseCache(2, 1<<20)
	c.put(id(1), fingerprintSum{}, rec(1), now.Add(time.Hour))
	c.put(id(2), fingerprintSum{}, rec(1), now.Add(time.Hour))
	require.NotNil(t, c.get(id(1), now)) // 1 is now the most recent
	c.put(id(3), fingerprintSum{}, rec(1), now.Add(time.Hour))
	require.Nil(t, c.get(id(2), now), "the least recently used went")
	require.NotNil(t, c.get(id(1), now))
	require.NotNil(t, c.get(id(3), now))

	c = newResponseCache(100, 8*1024)
	c.put(id(1), fingerprintSum{}, rec(2000), now.Add(time.Hour)) // over an eighth: not kept
	require.Nil(t, c.get(id(1), now))
	for i := range byte(20) {
		c.put(id(i), fingerprintSum{}, rec(500), now.Add(time.Hour))
	}
	require.LessOrEqual(t, c.bytes, int64(8*1024))
	require.NotNil(t, c.get(id(19), now))

	c.put(id(50), fingerprintSum{}, rec(1), now.Add(time.Second))
	require.NotNil(t, c.get(id(50), now))
	require.Nil(t, c.get(id(50), now.Add(time.Second)), "an entry dies with its record")

	var off *responseCache = newResponseCache(0, 0)
	off.put(id(1), fingerprintSum{}, rec(1), now.Add(time.Hour))
	require.Nil(t, off.get(id(1), now))
}

func TestCachedReplayStillChecksTheRequest(t *testing.T) {
	s := newShop(t)
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "k", `{"amount":1}`).status)
	// Redis is no longer needed for this key on this instance...
	s.rdb.Del(t.Context(), clientKeys(s.idem.cfg.prefix, paymentID("k")).record)
	require.Equal(t, "true", s.post(c, "/payments", "k", `{"amount":1}`).header.Get(ReplayedHeader))
	// ...but a different request under the key is still refused.
	requireProblem(t, s.post(c, "/payments", "k", `{"amount":2}`), 422, "key-reused")
	require.EqualValues(t, 1, s.execs.Load())
}

// The in-process cache answers for a bounded time, and then asks Redis:
// after Redis lost its data and another instance ran the key again, every
// instance agrees within that bound.
func TestCacheAgreesWithRedisAfterDataLoss(t *testing.T) {
	a := newShop(t, WithResponseCacheTTL(300*time.Millisecond))
	b := newShopOn(t, a.rdb, WithKeyPrefix(a.idem.cfg.prefix), WithResponseCache(0, 0))
	unique := func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, strconv.FormatInt(time.Now().UnixNano(), 10))
	}
	a.handler, b.handler = unique, unique
	c := a.client()
	first := a.post(c, "/payments", "lost", `{}`)
	require.Equal(t, "true", a.post(c, "/payments", "lost", `{}`).header.Get(ReplayedHeader))

	redistest.DeletePrefix(t, a.rdb, a.idem.cfg.prefix) // Redis restarted without persistence
	again := b.post(c, "/payments", "lost", `{}`)
	require.Empty(t, again.header.Get(ReplayedHeader), "the other instance ran the key again")
	require.NotEqual(t, first.body, again.body)
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest(http.MethodPost, a.srv.URL+"/payments", strings.NewReader(`{}`))
		req.Header.Set(KeyHeader, "lost")
		got, err := tryDo(c, req)
		return err == nil && got.body == again.body
	}, 2*time.Second, 50*time.Millisecond, "the cached answer gives way to Redis's")
}
