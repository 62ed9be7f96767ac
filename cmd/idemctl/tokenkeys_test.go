package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// An upgrade from a version that kept the token secret in Redis: the ring
// token-keys prints keeps every token of the kept secret good, and every
// spent token of a retired one replaying.
func TestTokenKeysCarriesTheRedisSecretOver(t *testing.T) {
	s := newService(t)
	ctx := t.Context()
	kept, retired := bytes.Repeat([]byte{'k'}, 32), bytes.Repeat([]byte{'r'}, 32)
	none := s.idemctl("", false, "token-keys")
	expect(t, none, 1)
	if !strings.Contains(none.stderr, "keeps no token secret") || none.stdout != "" {
		t.Errorf("token-keys without a secret in Redis: stdout %q, stderr %q", none.stdout, none.stderr)
	}
	must(t, s.rdb.Set(ctx, s.prefix+":token-secret", kept, 0).Err())
	must(t, s.rdb.ZAdd(ctx, s.prefix+":token-secret:retired", redisZ(retired)).Err())

	// Tokens of both secrets, spent as the old version spent them.
	spentOld := spend(t, s, idempotency.WithTokenSecret(retired))
	spentKept := spend(t, s, idempotency.WithTokenSecret(kept))

	out := s.idemctl("", false, "token-keys")
	expect(t, out, 0, "sign=", "revoked=")
	ring, err := idempotency.ParseTokenKeys(out.stdout)
	if err != nil {
		t.Fatalf("token-keys printed %q: %v", out.stdout, err)
	}
	if !bytes.Equal(ring.Sign, kept) || len(ring.Revoked) != 1 || !bytes.Equal(ring.Revoked[0], retired) {
		t.Fatalf("ring %+v: want the kept secret signing and the retired one revoked", ring)
	}
	for _, spent := range []spentToken{spentOld, spentKept} {
		if got := spent.again(s, idempotency.WithTokenKeys(ring)); got != "201 replayed" {
			t.Errorf("a token spent before the upgrade: %s after it, want its replay", got)
		}
	}
}

// spentToken is a token spent once, and how to send it again.
type spentToken struct{ session, token string }

func spend(t *testing.T, s *service, keys idempotency.Option) spentToken {
	t.Helper()
	const session = "00000000-0000-4000-8000-000000000001"
	m := idempotency.New(s.rdb, idempotency.WithKeyPrefix(s.prefix), keys)
	tok, err := m.IssueTokenFor(httptest.NewRequest(http.MethodGet, "/", nil), session)
	must(t, err)
	sp := spentToken{session, tok.Value}
	if got := sp.send(m); got != "201 first" {
		t.Fatalf("spending a token: %s", got)
	}
	return sp
}

func (sp spentToken) again(s *service, keys idempotency.Option) string {
	return sp.send(idempotency.New(s.rdb, idempotency.WithKeyPrefix(s.prefix), keys))
}

// send answers the status, and whether it was the first run or a replay.
func (sp spentToken) send(m *idempotency.Middleware) string {
	h := m.Protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	r.Header.Set(idempotency.KeyHeader, sp.token)
	r.AddCookie(&http.Cookie{Name: "idempotency_session", Value: sp.session})
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Header().Get(idempotency.ReplayedHeader) == "true" {
		return strconv.Itoa(w.Code) + " replayed"
	}
	return strconv.Itoa(w.Code) + " first"
}

func redisZ(member []byte) redis.Z {
	return redis.Z{Score: float64(time.Now().UnixMilli()), Member: member}
}
