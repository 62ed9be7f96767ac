package sqlstoretest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/sqltest"
)

// Whether a token has expired is the database's to say, on the one clock
// that every instance's claims of it meet. A submission sent with life
// left whose claim reaches the database after the token expired (behind a
// slow link) is refused as expired, as a later double click on another
// instance was: "token-expired" means nothing ran and nothing will.
func TestATokenClaimLandingAfterItsExpiryIsNotSpent(t *testing.T) {
	eachServer(t, func(t *testing.T, d *sqltest.DB) {
		const ttl = 1500 * time.Millisecond
		table := d.Table(t, "idem_expiry")
		opts := []idempotency.Option{idempotency.WithSQLTable(table), idempotency.WithTokenTTL(ttl),
			idempotency.WithTokenKeys(idempotency.TokenKeys{Sign: []byte("the expiry test's token key, 32 bytes or more")})}
		runs := new(atomic.Int32)
		fast := formShop(t, idempotency.NewSQL(d.DB, d.Dialect, opts...), runs)
		slowDB, proxy := viaProxy(t, d)
		slow := formShop(t, idempotency.NewSQL(slowDB, d.Dialect, append(opts, idempotency.WithStoreTimeout(3*time.Second))...), runs)
		warm := func(srv *httptest.Server) { tokenOf(t, srv) } // the table exists, the pools hold a connection
		warm(fast)
		warm(slow)

		tok, session := tokenOf(t, fast)
		issued := time.Now() // the token expires ttl after a moment before this one
		time.Sleep(time.Until(issued.Add(ttl - 300*time.Millisecond)))
		proxy.HoldCommand(tok, 700*time.Millisecond) // its claim lands 400 ms after the expiry
		first := make(chan *http.Response)
		go func() { first <- order(t, slow, tok, session) }()

		time.Sleep(time.Until(issued.Add(ttl + 100*time.Millisecond)))
		requireExpired(t, order(t, fast, tok, session))
		requireExpired(t, <-first)
		requireExpired(t, order(t, fast, tok, session))
		require.Zero(t, runs.Load(), "a token answered as expired never runs")
	})
}

// formShop serves m's token endpoint at /token and a form route in token
// mode at /orders, whose runs it counts.
func formShop(t *testing.T, m *idempotency.Middleware, runs *atomic.Int32) *httptest.Server {
	mux := http.NewServeMux()
	mux.Handle("/token", m.TokenHandler())
	mux.Handle("POST /orders", m.Protect(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// tokenOf takes a token from srv, and the session cookie it was issued to.
func tokenOf(t *testing.T, srv *httptest.Server) (token, session string) {
	resp, err := http.Get(srv.URL + "/token")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var body struct {
		Token string `json:"token"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	var cookies []string
	for _, c := range resp.Cookies() {
		cookies = append(cookies, c.Name+"="+c.Value)
	}
	return body.Token, strings.Join(cookies, "; ")
}

// order posts the form with token, in session.
func order(t *testing.T, srv *httptest.Server, token, session string) *http.Response {
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.KeyHeader, token)
	req.Header.Set("Cookie", session)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	return resp
}

func requireExpired(t *testing.T, resp *http.Response) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), idempotency.ProblemTypeBase+"token-expired")
}
