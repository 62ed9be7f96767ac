package idempotency

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// 10⁶ tokens from the issuance generator collide nowhere (122 random bits
// make a collision among 10⁶ about a 10⁻²⁵ event), and each is canonical.
func TestTokenGeneratorHasNoCollisions(t *testing.T) {
	n := trials(1_000_000, 10_000_000)
	seen := make(map[[16]byte]struct{}, n)
	for range n {
		tok, err := newToken()
		require.NoError(t, err)
		id := uuid.MustParse(tok)
		require.Equal(t, uuid.Version(4), id.Version())
		seen[id] = struct{}{}
	}
	require.Len(t, seen, n)
	t.Logf("%d tokens generated: %d distinct, 0 collisions", n, len(seen))
}

// 10⁵ random, well-formed tokens (an expiry in the future, random nonce
// and MAC) probed against a session that holds 32 real ones: none is
// accepted, and none spends a real token.
func TestRandomTokenProbesNeverHit(t *testing.T) {
	s := newShop(t)
	c := s.client()
	var real []string
	for range 32 {
		real = append(real, s.token(c))
	}
	session := sessionOf(t, s, c)
	h := s.idem.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.execs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	n := trials(100_000, 1_000_000)
	var hits, rejected atomic.Int64
	var wg sync.WaitGroup
	per := n / 8
	for range 8 {
		wg.Go(func() {
			for range per {
				r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
				r.AddCookie(&http.Cookie{Name: "idempotency_session", Value: session})
				var b [tokenBytes]byte
				rand.Read(b[:])
				binary.BigEndian.PutUint64(b[:8], uint64(time.Now().Add(time.Hour).UnixMilli()))
				r.Header.Set(KeyHeader, base64.RawURLEncoding.EncodeToString(b[:]))
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code == http.StatusUnprocessableEntity {
					rejected.Add(1)
				} else {
					hits.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d random token probes against a session holding 32 tokens: %d hits, %d rejected", 8*per, hits.Load(), rejected.Load())
	require.Zero(t, hits.Load())
	require.Zero(t, s.execs.Load())
	// Every real token still works.
	for _, tok := range real {
		require.Equal(t, http.StatusCreated, s.post(c, "/orders", tok, `{}`).status)
	}
}

// A session cannot read another session's replay, nor learn whether a
// token exists elsewhere: the answer is the unknown-token answer.
func TestScopesCannotReadEachOthersReplays(t *testing.T) {
	s := newShop(t)
	alice, mallory := s.client(), s.client()
	tok := s.token(alice)
	s.token(mallory)
	require.Equal(t, http.StatusCreated, s.post(alice, "/orders", tok, `{"card":"4242"}`).status)

	stolen := s.post(mallory, "/orders", tok, `{"card":"4242"}`)
	unknown := s.post(mallory, "/orders", "3f1e2d4c-5b6a-4789-8abc-def012345678", `{"card":"4242"}`)
	requireProblem(t, stolen, http.StatusUnprocessableEntity, "token-not-found")
	require.Equal(t, unknown.body, stolen.body, "a used token elsewhere looks like no token at all")
	require.NotContains(t, stolen.body, "execution")
	require.Equal(t, "true", s.post(alice, "/orders", tok, `{"card":"4242"}`).header.Get(ReplayedHeader))
	require.EqualValues(t, 1, s.execs.Load())
}

// Malformed keys never reach Redis, whatever their size or bytes.
func TestHostileKeysRejectedBeforeRedis(t *testing.T) {
	s := newShop(t)
	c := s.client()
	for _, key := range []string{
		strings.Repeat("k", 256), strings.Repeat("k", 64<<10), "a\x00b", "naïve", "tab\there", "\x7f",
	} {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{}`))
		req.Header.Set(KeyHeader, key)
		w := httptest.NewRecorder()
		s.idem.ProtectKey(http.NotFoundHandler()).ServeHTTP(w, req)
		require.Equal(t, http.StatusBadRequest, w.Code, "%q", key)
	}
	// CR and LF cannot travel in a header; in a form they are refused too.
	requireProblem(t, s.postForm(c, "/orders", "idempotency_token=a%0D%0ASet-Cookie:%20x=1"), 400, "invalid-key")
	keys, err := s.rdb.Keys(t.Context(), "test-"+t.Name()+"*").Result()
	require.NoError(t, err)
	require.Empty(t, keys, "nothing was written")
}
