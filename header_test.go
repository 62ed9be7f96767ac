package idempotency

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/redistest"
)

// Header values round-trip any byte: a replay from Redis sends what net/http
// sent the first time, grows no header, and a stored Set-Cookie never comes
// back.
func TestHeaderValuesRoundTripAnyByte(t *testing.T) {
	s := newShop(t, WithResponseCache(0, 0)) // every replay from Redis
	other := newShopOn(t, s.rdb, WithKeyPrefix(s.idem.cfg.prefix))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Search", "tea\nSet-Cookie: session=attacker")
		w.Header().Set("X-Split", "a\nb")
		w.Header().Set("X-Colon", "k: v")
		w.Header()["X-Bytes"] = []string{"\t\xff ü", ""}
		w.WriteHeader(http.StatusCreated)
	}
	c := s.client()
	first := s.post(c, "/payments", "hdr", `{}`)
	require.Equal(t, http.StatusCreated, first.status)
	for _, replay := range []answer{s.post(c, "/payments", "hdr", `{}`), other.post(c, "/payments", "hdr", `{}`)} {
		require.Equal(t, http.StatusCreated, replay.status)
		require.Equal(t, "true", replay.header.Get(ReplayedHeader))
		require.Empty(t, replay.header.Values("Set-Cookie"))
		for _, name := range []string{"X-Search", "X-Split", "X-Colon", "X-Bytes"} {
			require.Equal(t, first.header.Values(name), replay.header.Values(name), name)
		}
	}
	require.EqualValues(t, 1, s.execs.Load())
}

// Records of the line format that earlier versions stored still replay.
func TestRecordsOfTheLineFormatStillReplay(t *testing.T) {
	s := newShop(t, WithResponseCache(0, 0))
	c := s.client()
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "old", `{}`).status)
	k := clientKeys(s.idem.cfg.prefix, paymentID("old"))
	require.NoError(t, redistest.EditRecord(t.Context(), s.rdb, k.record, func(r *keyspace.Record) {
		r.Header = "Location: /orders/7\nX-Old: yes\n"
	}))
	a := s.post(c, "/payments", "old", `{}`)
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, "/orders/7", a.header.Get("Location"))
	require.Equal(t, "yes", a.header.Get("X-Old"))
}
