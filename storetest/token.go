package storetest

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/syncbuf"
)

// tokenKeys is the key ring every instance of the kit's services shares,
// as configuration: a token one issues, another accepts.
var tokenKeys = idempotency.WithTokenKeys(idempotency.TokenKeys{Sign: []byte("the conformance kit's token key, 32 bytes or more")})

// Token mode (Protect): a token issued by one instance is spent once, on
// another; its resubmission is replayed on every instance; a token that
// was never issued, or sent without its session, is refused
// token-not-found, and the token with another body key-reused.
func tokenSpentOnce(t *testing.T, ks Keyspace) {
	var h runs
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		created(w, h.start(r.Context()), string(body))
	})
	a, b := serveToken(t, ks, handler, tokenKeys), serveToken(t, ks, handler, tokenKeys)
	token, session := issue(t, a, "")
	require.NotEmpty(t, session, "the token endpoint starts a session")

	first := post(t, b.url, token, `{"item":"tea"}`, "Cookie", session)
	require.Equal(t, http.StatusCreated, first.status, "answer: %s", first)
	require.False(t, first.replayed())
	for _, in := range []*instance{a, b} {
		requireReplay(t, first, post(t, in.url, token, `{"item":"tea"}`, "Cookie", session))
	}
	require.EqualValues(t, 1, h.count())

	requireProblem(t, post(t, a.url, token, `{"item":"cake"}`, "Cookie", session),
		http.StatusUnprocessableEntity, "key-reused")
	requireProblem(t, post(t, a.url, "not-a-token-anyone-issued", `{"item":"tea"}`, "Cookie", session),
		http.StatusUnprocessableEntity, "token-not-found")
	requireProblem(t, post(t, b.url, token, `{"item":"tea"}`),
		http.StatusUnprocessableEntity, "token-not-found")
	require.EqualValues(t, 1, h.count())

	// Another token of the session is another submission.
	second, _ := issue(t, b, session)
	again := post(t, a.url, second, `{"item":"tea"}`, "Cookie", session)
	require.Equal(t, http.StatusCreated, again.status, "answer: %s", again)
	require.False(t, again.replayed())
	require.EqualValues(t, 2, h.count())
}

// issue takes a token from in's token endpoint in the session (a Cookie
// header, "" for none yet), and returns it with the session.
func issue(t *testing.T, in *instance, session string) (token, cookie string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, in.base+"/token", nil)
	require.NoError(t, err)
	if session != "" {
		req.Header.Set("Cookie", session)
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var body struct {
		Token string `json:"token"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.NotEmpty(t, body.Token)
	cookie = session
	for _, c := range resp.Cookies() {
		cookie = c.Name + "=" + c.Value
	}
	return body.Token, cookie
}

// Instances that sign with a key another instance's ring lacks are told
// once, at start-up: the instance whose ring lacks a key that signed
// within the token TTL logs it as an error, naming how many; one whose
// ring holds every such key logs nothing.
func tokenKeysThatDifferAreLogged(t *testing.T, ks Keyspace) {
	key := func(c byte) []byte { return bytes.Repeat([]byte{c}, 32) }
	a, c, e, f := key('a'), key('c'), key('e'), key('f')
	const lacks = "key(s) this instance's ring lacks"
	// signing starts an instance with ring that issues a token, and
	// returns what it logs.
	signing := func(ring idempotency.TokenKeys) *syncbuf.Buffer {
		var logs syncbuf.Buffer
		m := open(t, ks, idempotency.WithTokenKeys(ring), idempotency.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		_, err := m.IssueTokenFor(httptest.NewRequest(http.MethodGet, "/", nil), "u")
		require.NoError(t, err)
		return &logs
	}
	// seen starts probes with ring until one logs that it lacks n keys:
	// the store holds every key that signed before it then.
	seen := func(ring idempotency.TokenKeys, n int) {
		t.Helper()
		want := "by " + strconv.Itoa(n) + " " + lacks
		require.True(t, eventually(func() bool {
			logs := signing(ring)
			return eventuallyWithin(time.Second, func() bool { return strings.Contains(logs.String(), want) })
		}), "an instance signing with another key is told: %q", want)
	}

	signing(idempotency.TokenKeys{Sign: a})
	seen(idempotency.TokenKeys{Sign: c}, 1) // a, which c's ring lacks

	// An instance whose ring holds a and c, signing with a key of its own:
	// once a probe counts that key, its check has been made. Its ring
	// holds the probe's key too, which may sign before its check.
	holds := signing(idempotency.TokenKeys{Sign: e, Accept: [][]byte{a, c, f}})
	seen(idempotency.TokenKeys{Sign: f}, 3) // a, c and e
	require.NotContains(t, holds.String(), "level=ERROR", "a ring that holds every key that signed")
	require.NotContains(t, holds.String(), string(a), "no key is logged, only its name")
}
