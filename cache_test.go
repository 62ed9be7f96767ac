package idempotency

import (
	"net/http"
	"testing"
	"time"

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
