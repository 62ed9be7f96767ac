package client

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/onceonly/idempotency"
	"github.com/stretchr/testify/require"
)

// A request without a key gets one random UUID, the same on every attempt,
// and the caller's request is left without it.
func TestTransportGeneratesOneKeyPerRequest(t *testing.T) {
	srv := newScriptedServer(t, answerUnavailable, answerUnavailable, answerCreated)
	req := newPost(t, srv.URL, `{"amount":500}`)
	code, _, _ := postTo(t, fastTransport(t), req)
	require.Equal(t, http.StatusCreated, code)

	id := generatedKey(t, srv.seen(), 3)
	require.Equal(t, uuid.Version(4), id.Version())
	require.Empty(t, req.Header.Values(KeyHeader), "the caller's request is not changed")
}

// 10⁶ keys from the generator collide nowhere (122 random bits make a
// collision among 10⁶ about a 10⁻²⁵ event), and each is a canonical
// version 4 UUID.
func TestKeyGeneratorHasNoCollisions(t *testing.T) {
	const n = 1_000_000
	seen := make(map[uuid.UUID]struct{}, n)
	for range n {
		key, err := newKey()
		require.NoError(t, err)
		id := uuid.MustParse(key)
		require.Equal(t, uuid.Version(4), id.Version())
		require.Equal(t, id.String(), key)
		seen[id] = struct{}{}
	}
	require.Len(t, seen, n)
}

// A key the caller set is sent on every attempt, alone and unchanged,
// whatever the spelling of its header's name (stripe-php #637 replaced it
// with a generated one on retries).
func TestTransportKeepsTheCallersKey(t *testing.T) {
	for _, name := range []string{KeyHeader, "idempotency-key"} {
		t.Run(name, func(t *testing.T) {
			srv := newScriptedServer(t, problemOf(idempotency.ErrInProgress), answerUnavailable, answerCreated)
			req := newPost(t, srv.URL, `{"amount":500}`)
			req.Header[name] = []string{"order-8-payment"}
			code, _, _ := postTo(t, fastTransport(t), req)
			require.Equal(t, http.StatusCreated, code)
			require.Equal(t, []string{"order-8-payment", "order-8-payment", "order-8-payment"}, keysOf(t, srv.seen()))
			require.Equal(t, []string{"order-8-payment"}, req.Header[name])
		})
	}
}

// Two requests through one Transport, and one *http.Request sent twice, get
// a key each: nothing of one request's key stays behind for the next
// (stripe-ruby #598 carried a key into the next call).
func TestTransportNeverCarriesAKeyIntoAnotherRequest(t *testing.T) {
	srv := newScriptedServer(t, answerCreated)
	rt := fastTransport(t)
	again := newPost(t, srv.URL, `{"amount":500}`)
	postTo(t, rt, newPost(t, srv.URL, `{"amount":100}`))
	postTo(t, rt, again)
	postTo(t, rt, again)

	keys := keysOf(t, srv.seen())
	require.Len(t, keys, 3)
	require.NotEqual(t, keys[0], keys[1])
	require.NotEqual(t, keys[1], keys[2], "a request sent again is a new request")
	require.NotEqual(t, keys[0], keys[2])
	require.Empty(t, again.Header.Values(KeyHeader))
}

// Attempts after the first send the body again, byte for byte, from
// GetBody; a body that cannot be read again is sent once, never retried.
func TestTransportResendsTheBodyThroughGetBody(t *testing.T) {
	const body = `{"amount":500,"currency":"EUR","note":"` + "é\x00\n" + `"}`
	t.Run("GetBody", func(t *testing.T) {
		srv := newScriptedServer(t, hangUp, answerUnavailable, answerCreated)
		code, _, _ := postTo(t, fastTransport(t), newPost(t, srv.URL, body))
		require.Equal(t, http.StatusCreated, code)
		seen := srv.seen()
		require.Len(t, seen, 3)
		for _, a := range seen {
			require.Equal(t, body, a.body)
		}
	})
	t.Run("no GetBody", func(t *testing.T) {
		srv := newScriptedServer(t, answerUnavailable, answerCreated)
		req, err := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(strings.NewReader(body)))
		require.NoError(t, err)
		require.Nil(t, req.GetBody)
		code, header, _ := postTo(t, fastTransport(t), req)
		require.Equal(t, http.StatusServiceUnavailable, code, "the one answer, as it was")
		require.Equal(t, "0", header.Get("Retry-After"))
		seen := srv.seen()
		require.Len(t, seen, 1)
		require.Equal(t, body, seen[0].body)
		require.Len(t, keysOf(t, seen), 1, "still sent with a key")
	})
}

// Only the keyed methods get a key and retries; the others reach the
// server untouched, once.
func TestTransportKeysOnlyItsMethods(t *testing.T) {
	for _, tc := range []struct {
		name    string
		methods []string
		method  string
		keyed   bool
	}{
		{"POST", nil, http.MethodPost, true},
		{"PATCH", nil, http.MethodPatch, true},
		{"GET", nil, http.MethodGet, false},
		{"PUT", nil, http.MethodPut, false},
		{"DELETE", nil, http.MethodDelete, false},
		{"PUT when configured", []string{http.MethodPut}, http.MethodPut, true},
		{"POST when not configured", []string{http.MethodPut}, http.MethodPost, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newScriptedServer(t, answerUnavailable, answerCreated)
			rt := fastTransport(t)
			rt.Methods = tc.methods
			req, err := http.NewRequest(tc.method, srv.URL, nil)
			require.NoError(t, err)
			code, _, _ := postTo(t, rt, req)
			seen := srv.seen()
			if !tc.keyed {
				require.Equal(t, http.StatusServiceUnavailable, code)
				require.Len(t, seen, 1)
				require.Empty(t, seen[0].keys)
				return
			}
			require.Equal(t, http.StatusCreated, code)
			require.Len(t, keysOf(t, seen), 2)
			require.Equal(t, tc.method, seen[1].method)
		})
	}
}

// A request built by hand with no Header map, which http.Client would have
// given one, still gets its key.
func TestTransportRequestWithoutHeader(t *testing.T) {
	srv := newScriptedServer(t, answerCreated)
	req := newPost(t, srv.URL, `{}`)
	req.Header = nil
	resp, err := fastTransport(t).RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, keysOf(t, srv.seen()), 1)
	require.Nil(t, req.Header)
}

// An Idempotency-Key entry with no value, or only empty ones, is no key:
// net/http sends nothing for it, and a server without the middleware (or
// with WithOptionalKey) would run every retry. The request gets a key of
// its own, the same on every attempt, and the caller's header stays as it
// was.
func TestTransportGeneratesAKeyForAnEmptyKeyHeader(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header string
		values []string
	}{
		{"nil", KeyHeader, nil},
		{"no values", KeyHeader, []string{}},
		{"empty value", KeyHeader, []string{""}},
		{"blank value", KeyHeader, []string{" \t"}},
		{"empty values", KeyHeader, []string{"", ""}},
		{"empty value, other spelling", "idempotency-key", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newScriptedServer(t, hangUp, answerUnavailable, answerCreated)
			req := newPost(t, srv.URL, `{"amount":500}`)
			req.Header[tc.header] = tc.values
			code, _, _ := postTo(t, fastTransport(t), req)
			require.Equal(t, http.StatusCreated, code)

			generatedKey(t, srv.seen(), 3)
			require.Equal(t, tc.values, req.Header[tc.header], "the caller's request is not changed")
		})
	}
}

// A Base that answers neither a response nor an error breaks the
// RoundTripper contract: the Transport answers it with an error, as
// http.Client does, after one attempt, and never panics.
func TestTransportRefusesANilResponseFromBase(t *testing.T) {
	var calls int
	base := roundTripperFunc(func(*http.Request) (*http.Response, error) {
		calls++
		return nil, nil
	})
	resp, err := (&Transport{Base: base}).RoundTrip(newPost(t, "http://127.0.0.1:1/", `{}`))
	require.Nil(t, resp)
	require.ErrorContains(t, err, "nil *http.Response with a nil error")
	require.Equal(t, 1, calls)

	_, err = (&http.Client{Transport: &Transport{Base: base}}).Do(newPost(t, "http://127.0.0.1:1/", `{}`))
	require.Error(t, err)
}

// A blank value beside the caller's key counts as none, as docs/client.md
// says: every attempt carries the caller's key alone, never a pair the
// server refuses as a repeated key. Two keys of the caller's go out as
// they are.
func TestTransportDropsBlankValuesBesideTheCallersKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header http.Header
		want   []string
	}{
		{"blank first", http.Header{KeyHeader: {"", "abc"}}, []string{"abc"}},
		{"blank after", http.Header{KeyHeader: {"abc", " \t"}}, []string{"abc"}},
		{"blank under another spelling", http.Header{KeyHeader: {"abc"}, "idempotency-key": {""}}, []string{"abc"}},
		{"two keys", http.Header{KeyHeader: {"abc", "def"}}, []string{"abc", "def"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newScriptedServer(t, answerUnavailable, answerCreated)
			req := newPost(t, srv.URL, `{}`)
			for name, values := range tc.header {
				req.Header[name] = values
			}
			code, _, _ := postTo(t, fastTransport(t), req)
			require.Equal(t, http.StatusCreated, code)
			for _, s := range srv.seen() {
				require.ElementsMatch(t, tc.want, s.keys)
			}
		})
	}
}
