package idempotency

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/syncbuf"
)

// A header the handler set under a name that is not canonical
// (w.Header()["ETag"]) is judged by its canonical name: kept under an
// allowlist that names it, and never replayed when it is a cookie.
func TestNonCanonicalHeaderNamesFollowThePolicy(t *testing.T) {
	for name, opts := range map[string][]Option{
		"default policy": nil,
		"allowlist":      {WithReplayHeaders("ETag", "X-Note")},
	} {
		t.Run(name, func(t *testing.T) {
			s := newShop(t, append(opts, WithResponseCache(0, 0))...)
			other := newShopOn(t, s.rdb, WithKeyPrefix(s.idem.cfg.prefix))
			s.handler = func(w http.ResponseWriter, r *http.Request) {
				w.Header()["ETag"] = []string{`"v1"`}
				w.Header()["x-note"] = []string{"kept"}
				w.Header()["set-cookie"] = []string{"session=s1"}
				w.WriteHeader(http.StatusCreated)
			}
			// No cookie jar: a retry carrying the cookie would be another
			// caller's request under key mode's default scope.
			c := &http.Client{Timeout: 30 * time.Second}
			first := s.post(c, "/payments", "names", `{}`)
			require.Equal(t, "session=s1", first.header.Get("Set-Cookie"), "the first answer keeps its cookie")
			for _, replay := range []answer{s.post(c, "/payments", "names", `{}`), other.post(c, "/payments", "names", `{}`)} {
				require.Equal(t, "true", replay.header.Get(ReplayedHeader))
				require.Equal(t, `"v1"`, replay.header.Get("ETag"))
				require.Equal(t, "kept", replay.header.Get("X-Note"))
				require.Empty(t, replay.header.Values("Set-Cookie"), "a cookie is never replayed, whatever its name's case")
			}
		})
	}
}

// A stored Set-Cookie (or hop-by-hop header) is filtered at replay too, even
// when the record was written by an instance configured to keep it.
func TestReplayFiltersHeadersOfTheRecord(t *testing.T) {
	s := newShop(t, WithReplayHeaders("Set-Cookie", "Location", "Content-Type"))
	other := newShopOn(t, s.rdb, WithKeyPrefix(s.idem.cfg.prefix))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "cookie", `{}`).status)
	require.NotEmpty(t, s.post(c, "/payments", "cookie", `{}`).header.Values("Set-Cookie"), "configured to replay it")
	replay := other.post(c, "/payments", "cookie", `{}`)
	require.Equal(t, "true", replay.header.Get(ReplayedHeader))
	require.Empty(t, replay.header.Values("Set-Cookie"), "the default policy drops it at replay")
	require.Equal(t, "/orders/1", replay.header.Get("Location"))
}

// A record that cannot be decoded is answered truthfully: it ran, its answer
// cannot be replayed. Never 503 "nothing ran, retry".
func TestUndecodableRecordIsNotStoreUnavailable(t *testing.T) {
	var logs syncbuf.Buffer
	s := newShop(t, WithResponseCache(0, 0), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "corrupt", `{}`).status)
	k := clientKeys(s.idem.cfg.prefix, paymentID("corrupt"))
	require.NoError(t, redistest.EditRecord(t.Context(), s.rdb, k.record, func(r *keyspace.Record) { r.Header = "\x01\x05ab" }))
	for range 2 {
		a := s.post(c, "/payments", "corrupt", `{}`)
		requireProblem(t, a, http.StatusConflict, "unreadable-record")
		require.Empty(t, a.header.Get("Retry-After"), "retrying cannot help")
	}
	require.Contains(t, logs.String(), "cannot be decoded")
	require.EqualValues(t, 1, s.execs.Load())
}
