package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency/example/internal/bank"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/stretchr/testify/require"
)

// transferShop serves the shop with its accounts in d, in tables of the
// test's own, and says how to reach it.
type transferShop struct {
	t    *testing.T
	bank *bank.Bank
	url  string
	// run names this run's keys: the shared Redis outlives the subtests,
	// and a key another database's subtest used would replay its answer.
	run string
}

func startTransferShop(t *testing.T, d *sqltest.DB) *transferShop {
	prefix := d.Table(t, "shop") + "_"
	t.Cleanup(func() {
		for _, table := range []string{"accounts", "transfers", sqlidem.DefaultTable} {
			d.Exec("DROP TABLE IF EXISTS " + prefix + table)
		}
	})
	b, err := bank.New(d.DB, d.Dialect, prefix)
	require.NoError(t, err)
	require.NoError(t, b.Setup(t.Context(), bank.DemoAccounts))
	app, _, err := newApp(onRedis(redistest.Client(t, "shop:")), config{}, b)
	require.NoError(t, err)
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	var run [6]byte
	rand.Read(run[:])
	return &transferShop{t: t, bank: b, url: srv.URL, run: hex.EncodeToString(run[:])}
}

type transferReply struct {
	status   int
	body     string
	replayed bool
	problem  string
}

func (s *transferShop) tryTransfer(key, body string) (transferReply, error) {
	req, _ := http.NewRequest(http.MethodPost, s.url+"/transfers", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", s.run+"-"+key)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return transferReply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	r := transferReply{status: resp.StatusCode, body: string(raw), replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var p struct{ Type string }
		json.Unmarshal(raw, &p)
		r.problem = strings.TrimPrefix(p.Type, "/problems/")
	}
	return r, err
}

func (s *transferShop) transfer(key, body string) transferReply {
	r, err := s.tryTransfer(key, body)
	require.NoError(s.t, err)
	return r
}

// balances reads GET /accounts.
func (s *transferShop) balances() map[string]int64 {
	resp, err := http.Get(s.url + "/accounts")
	require.NoError(s.t, err)
	defer resp.Body.Close()
	require.Equal(s.t, http.StatusOK, resp.StatusCode)
	var accounts []bank.Account
	require.NoError(s.t, json.NewDecoder(resp.Body).Decode(&accounts))
	out := map[string]int64{}
	for _, a := range accounts {
		out[a.ID] = a.Balance
	}
	return out
}

func (s *transferShop) transfers() int {
	_, table := s.bank.Tables()
	var n int
	require.NoError(s.t, s.bank.DB().QueryRow("SELECT COUNT(*) FROM "+table).Scan(&n))
	return n
}

// after returns the demo balances moved by amounts, keyed "from>to".
func after(moves map[string]int64) map[string]int64 {
	want := map[string]int64{}
	for id, balance := range bank.DemoAccounts {
		want[id] = balance
	}
	for move, amount := range moves {
		from, to, _ := strings.Cut(move, ">")
		want[from] -= amount
		want[to] += amount
	}
	return want
}

func TestTransferDuplicateIsReplayed(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		s := startTransferShop(t, d)
		body := `{"from":"alice","to":"bob","amount":2500}`
		first := s.transfer("t1", body)
		require.Equal(t, http.StatusCreated, first.status, first.body)
		var receipt bank.Receipt
		require.NoError(t, json.Unmarshal([]byte(first.body), &receipt))
		require.Equal(t, map[string]int64{"alice": 97_500, "bob": 52_500}, receipt.Balances)

		// Another serialisation of the same JSON is the same transfer.
		again := s.transfer("t1", `{ "amount": 2500, "to": "bob", "from": "alice" }`)
		require.Equal(t, http.StatusCreated, again.status)
		require.True(t, again.replayed)
		require.Equal(t, first.body, again.body)
		require.Equal(t, after(map[string]int64{"alice>bob": 2500}), s.balances())
		require.Equal(t, 1, s.transfers())

		// The key is the transfer's: another transfer under it is refused.
		other := s.transfer("t1", `{"from":"alice","to":"bob","amount":2600}`)
		require.Equal(t, http.StatusUnprocessableEntity, other.status, other.body)
		require.Equal(t, 1, s.transfers())
	})
}

func TestConcurrentDuplicateTransfersMoveMoneyOnce(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		s := startTransferShop(t, d)
		const n = 20
		replies := make([]transferReply, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				replies[i], errs[i] = s.tryTransfer("same", `{"from":"bob","to":"carol","amount":1234}`)
			})
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
		replayed := 0
		for i, r := range replies {
			require.Equal(t, http.StatusCreated, r.status, "duplicate %d: %s", i, r.body)
			require.Equal(t, replies[0].body, r.body, "every duplicate gets the one answer")
			if r.replayed {
				replayed++
			}
		}
		require.Equal(t, n-1, replayed)
		require.Equal(t, after(map[string]int64{"bob>carol": 1234}), s.balances())
		require.Equal(t, 1, s.transfers())
	})
}

// A refused transfer writes nothing and releases its key: the client
// corrects the request and sends it again under the same key.
func TestRefusedTransferRollsBackAndReleasesItsKey(t *testing.T) {
	sqltest.Each(t, func(t *testing.T, d *sqltest.DB) {
		s := startTransferShop(t, d)
		for i, c := range []struct {
			body, problem string
		}{
			{`{"from":"alice","to":"bob","amount":0}`, "invalid-amount"},
			{`{"from":"alice","to":"bob","amount":-5}`, "invalid-amount"},
			{`{"from":"carol","to":"bob","amount":25001}`, "insufficient-funds"},
			{`{"from":"alice","to":"mallory","amount":10}`, "unknown-account"},
			{`{"from":"mallory","to":"alice","amount":10}`, "unknown-account"},
			{`{"from":"alice","to":"alice","amount":10}`, "same-account"},
		} {
			key := fmt.Sprint("refused-", i)
			r := s.transfer(key, c.body)
			require.Equal(t, http.StatusUnprocessableEntity, r.status, "%s: %s", c.body, r.body)
			require.Equal(t, c.problem, r.problem, c.body)
			require.False(t, r.replayed)
			// The same refused request runs again rather than replaying.
			r = s.transfer(key, c.body)
			require.Equal(t, c.problem, r.problem, "a refusal is not stored")
			require.False(t, r.replayed)
			require.Equal(t, bank.DemoAccounts, s.balances(), "a refused transfer moved money")

			fixed := s.transfer(key, `{"from":"carol","to":"bob","amount":1}`)
			require.Equal(t, http.StatusCreated, fixed.status, "the corrected request under the same key: %s", fixed.body)
			require.False(t, fixed.replayed)
			back := s.transfer(key+"-back", `{"from":"bob","to":"carol","amount":1}`)
			require.Equal(t, http.StatusCreated, back.status, back.body)
		}
		require.Equal(t, bank.DemoAccounts, s.balances())
		require.Equal(t, 12, s.transfers())

		bad := s.transfer("not-json", `{"from":`)
		require.Equal(t, http.StatusBadRequest, bad.status)
		require.Equal(t, "invalid-transfer", bad.problem)
	})
}

func TestEmbeddedSQLiteNeedsNoSetUp(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	b, closeDB, err := openBank("", backend{})
	require.NoError(t, err)
	defer closeDB()
	accounts, err := b.Accounts(t.Context())
	require.NoError(t, err)
	require.Len(t, accounts, len(bank.DemoAccounts))
}

func TestDatabaseURLIsCheckedAtStart(t *testing.T) {
	// Refused before any connection: a bad parameter, a scheme no driver
	// serves. (A well-formed URL would connect, to whatever listens.)
	for _, url := range []string{"mysql://root:secret@127.0.0.1:3306/test?timeout=soon", "sqlserver://db/shop"} {
		t.Setenv("DATABASE_URL", url)
		_, _, err := openBank("", backend{})
		require.Error(t, err, url)
		require.NotContains(t, err.Error(), "127.0.0.1", "the URL may hold a password")
	}
}
