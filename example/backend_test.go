package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/stretchr/testify/require"
)

// Tests of IDEMPOTENCY_STORE: the example run as a program with its keys,
// tokens and shop in one database, and no Redis.

// With IDEMPOTENCY_STORE set, a payment runs once and its retry is
// replayed, a form submitted twice places one order, a callback is
// recorded once, and the log says that no Redis is used.
func TestIdempotencyStoreNeedsNoRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	for _, kind := range []sqltest.Kind{sqltest.SQLite, sqltest.PostgreSQL, sqltest.MySQL} {
		t.Run(string(kind), func(t *testing.T) {
			shop := startProcess(t, storeEnv(storeURL(t, kind))...)
			require.Contains(t, shop.Out.String(), "(IDEMPOTENCY_STORE); no Redis")
			require.NotContains(t, shop.Out.String(), "miniredis")

			first := payWith(t, shop.URL, "sql-pay-1")
			require.Equal(t, http.StatusCreated, first.status, first.body)
			require.Empty(t, first.replayed)
			again := payWith(t, shop.URL, "sql-pay-1")
			require.Equal(t, http.StatusCreated, again.status, again.body)
			require.Equal(t, "true", again.replayed)
			require.Equal(t, first.body, again.body)
			require.Equal(t, 1, countOf[Payment](t, shop.URL, "/payments"))

			// A duplicate sent while the first still runs waits for it
			// (polling the database) and gets its answer.
			var wg sync.WaitGroup
			replies := make([]payReply, 2)
			for i := range replies {
				wg.Go(func() { replies[i] = payWith(t, shop.URL, "sql-pay-2") })
				time.Sleep(50 * time.Millisecond)
			}
			wg.Wait()
			for _, r := range replies {
				require.Equal(t, http.StatusCreated, r.status, r.body)
			}
			require.Equal(t, replies[0].body, replies[1].body)
			require.Equal(t, 2, countOf[Payment](t, shop.URL, "/payments"))

			submitTwice(t, browser(t), shop.URL)
			require.Equal(t, 1, countOf[Order](t, shop.URL, "/orders"))

			for range 2 {
				resp := postJSON(t, shop.URL+"/callbacks/orders", "sql-event-1", `{"order":1,"status":"paid"}`)
				require.Equal(t, http.StatusOK, resp.status, resp.body)
			}
			resp, err := http.Get(shop.URL + "/callbacks/orders")
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, "0", resp.Header.Get(RerunsHeader))
			require.Equal(t, 1, countOf[struct{}](t, shop.URL, "/callbacks/orders"))

			// Text the database could not keep (a NUL, a status longer than
			// its column) is refused before anything runs, and the key goes
			// back for the corrected request: never a 500, stored for a day.
			for _, tc := range []struct{ path, key, bad, good string }{
				{"/payments", "sql-pay-3", `{"amount":500,"currency":"e\u0000r"}`, `{"amount":500,"currency":"eur"}`},
				{"/callbacks/orders", "sql-event-2", `{"order":2,"status":"` + strings.Repeat("x", 70_000) + `"}`,
					`{"order":2,"status":"paid"}`},
			} {
				bad := postJSON(t, shop.URL+tc.path, tc.key, tc.bad)
				require.Equal(t, http.StatusBadRequest, bad.status, bad.body)
				good := postJSON(t, shop.URL+tc.path, tc.key, tc.good)
				require.Less(t, good.status, 300, good.body)
			}
		})
	}
}

// Two instances on one PostgreSQL database are one shop: a payment's
// retry on the second replays the first's answer, and a form issued by one
// and submitted to both places one order.
func TestIdempotencyStoreIsSharedByInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	env := storeEnv(storeURL(t, sqltest.PostgreSQL))
	a := startProcess(t, env...)
	b := startProcess(t, env...)

	paid := payWith(t, a.URL, "shared-pay")
	require.Equal(t, http.StatusCreated, paid.status, paid.body)
	retry := payWith(t, b.URL, "shared-pay")
	require.Equal(t, http.StatusCreated, retry.status, retry.body)
	require.Equal(t, "true", retry.replayed)
	require.Equal(t, paid.body, retry.body)
	require.Equal(t, 1, countOf[Payment](t, b.URL, "/payments"))

	c := browser(t)
	form := url.Values{"item": {"tea"}, "quantity": {"1"}, "idempotency_token": {formToken(t, c, a.URL)}}
	for _, base := range []string{a.URL, b.URL} {
		resp, err := c.PostForm(base+"/orders", form)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	}
	require.Equal(t, 1, countOf[Order](t, a.URL, "/orders"))
}

// Start-up fails, naming IDEMPOTENCY_STORE, for a URL that does not parse
// and for a database that does not answer.
func TestIdempotencyStoreIsCheckedAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	closed := freeLoopbackAddr(t)
	for _, raw := range []string{
		"redis://127.0.0.1:6379/0",
		"mysql://root:secret@127.0.0.1:3306/test?timeout=soon",
		"sqlite:",
		"postgres://shop:secret@" + closed + "/shop?sslmode=disable&connect_timeout=2",
	} {
		out, err := runToExit(t, storeEnv(raw)...)
		require.Error(t, err, raw)
		require.Contains(t, out, "IDEMPOTENCY_STORE", raw)
		require.NotContains(t, out, "secret", "the URL may hold a password")
		require.NotContains(t, out, "listening", raw)
	}
}

// storeEnv is the environment of an example whose keys are in the
// database of raw: no Redis, and no database but that one.
func storeEnv(raw string) []string {
	return []string{"IDEMPOTENCY_STORE=" + raw, "REDIS_URL=", "REDIS_CLUSTER_ADDRS=", "DATABASE_URL=", "DB_PATH=",
		"PAYMENT_LATENCY=300ms"}
}

// storeURL is an IDEMPOTENCY_STORE of kind that no other test uses: a new
// SQLite file, a PostgreSQL schema or a MySQL database of its own, dropped
// when t ends. It skips t when POSTGRES_DSN or MYSQL_DSN names no server
// that answers, or one off this machine.
func storeURL(t *testing.T, kind sqltest.Kind) string {
	if kind == sqltest.SQLite {
		return "sqlite:" + filepath.Join(t.TempDir(), "keys.db")
	}
	d := sqltest.Open(t, kind)
	var b [4]byte
	rand.Read(b[:])
	name := "example_" + hex.EncodeToString(b[:])
	switch kind {
	case sqltest.PostgreSQL:
		u, err := url.Parse(d.DSN)
		require.NoError(t, err)
		requireLoopback(t, u.Hostname())
		_, err = d.Exec("CREATE SCHEMA " + name)
		require.NoError(t, err)
		t.Cleanup(func() { d.Exec("DROP SCHEMA " + name + " CASCADE") })
		q := u.Query()
		q.Set("search_path", name)
		u.RawQuery = q.Encode()
		return u.String()
	default:
		cfg, err := mysql.ParseDSN(d.DSN)
		require.NoError(t, err)
		host, _, _ := net.SplitHostPort(cfg.Addr)
		requireLoopback(t, host)
		_, err = d.Exec("CREATE DATABASE " + name)
		require.NoError(t, err)
		t.Cleanup(func() { d.Exec("DROP DATABASE " + name) })
		cfg.DBName = name
		return "mysql://" + cfg.FormatDSN()
	}
}

func requireLoopback(t *testing.T, host string) {
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		t.Skipf("the database is at %s, not on this machine's loopback; these tests stay on loopback", host)
	}
}

type payReply struct {
	status         int
	body, replayed string
}

func payWith(t *testing.T, base, key string) payReply {
	return postJSON(t, base+"/payments", key, `{"amount":500,"currency":"eur"}`)
}

func postJSON(t *testing.T, target, key, body string) payReply {
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	read, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return payReply{resp.StatusCode, string(read), resp.Header.Get("Idempotent-Replayed")}
}

// runToExit runs the example with env added to this process's environment
// and returns its output once it exited, within 30 s, and how it exited.
func runToExit(t *testing.T, env ...string) (string, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exampleBinary(t))
	cmd.Env = append(append(os.Environ(), "ADDR=127.0.0.1:0"), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// freeLoopbackAddr is a loopback address where nothing listens.
func freeLoopbackAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}
