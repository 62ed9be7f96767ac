package main

import (
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/admin"
	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
)

// sqlService is a service whose middleware keeps its keys in SQL
// (NewSQL), on a SQLite file that idemctl opens too, from its own
// process: /transfers commits its answer through sqlidem in the same
// file, and /plain is a route without SQL whose handler can be made to
// run past its execution timeout and give up, which leaves its key
// interrupted.
type sqlService struct {
	t                 *testing.T
	db                *sqltest.DB
	path              string // the SQLite file
	keys, outcomes    string // the tables
	prefix            string
	srv               *httptest.Server
	transfers, plains atomic.Int64
	hang              atomic.Bool
	records           sync.Map // Execution.Key by Idempotency-Key
}

func newSQLService(t *testing.T) *sqlService {
	t.Helper()
	s := &sqlService{t: t, db: sqltest.Open(t, sqltest.SQLite), prefix: "idemctl-sql"}
	s.path = strings.TrimPrefix(s.db.DSN[:strings.IndexByte(s.db.DSN, '?')], "file:")
	s.keys, s.outcomes = s.db.Table(t, "keys"), s.db.Table(t, "outcomes")
	outcomes, err := sqlidem.New(s.db.DB, sqlidem.SQLite, sqlidem.WithTable(s.outcomes))
	must(t, err)
	must(t, outcomes.CreateTable(t.Context()))
	m := idempotency.NewSQL(s.db.DB, s.db.Dialect, idempotency.WithSQLTable(s.keys), idempotency.WithKeyPrefix(s.prefix),
		idempotency.WithSharedKeys(), idempotency.WithResponseCache(0, 0),
		idempotency.WithExecutionTimeout(300*time.Millisecond), idempotency.WithLogger(slog.New(slog.DiscardHandler)))
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", m.ProtectKey(s.remember(outcomes.Handler(func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
		n := s.transfers.Add(1)
		w.Header().Set("X-Transfer", strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "transfer "+strconv.FormatInt(n, 10))
		return nil
	}))))
	mux.Handle("POST /plain", m.ProtectKey(s.remember(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.plains.Add(1)
		if s.hang.Load() {
			<-r.Context().Done() // cut off, it gives up: the key is kept
			return
		}
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "accepted")
	}))))
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sqlService) remember(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e, ok := idempotency.ExecutionOf(r.Context()); ok {
			s.records.Store(r.Header.Get(idempotency.KeyHeader), e.Key)
		}
		next.ServeHTTP(w, r)
	})
}

func (s *sqlService) record(key string) string {
	s.t.Helper()
	rec, ok := s.records.Load(key)
	if !ok {
		s.t.Fatalf("no execution of key %q", key)
	}
	return rec.(string)
}

func (s *sqlService) post(path, key string) reply {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(`{"amount":5}`))
	req.Header.Set(idempotency.KeyHeader, key)
	res, err := s.srv.Client().Do(req)
	must(s.t, err)
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return reply{res.StatusCode, string(body), res.Header.Get(idempotency.ReplayedHeader) == "true", res.Header}
}

// abandon rewrites key's row as an execution whose instance stopped before
// it stored an answer, claimed ago on the database's clock.
func (s *sqlService) abandon(key string, ago time.Duration) string {
	s.t.Helper()
	rec := s.record(key)
	var text []byte
	must(s.t, s.db.QueryRow("SELECT record FROM "+s.keys+" WHERE id = ?", rec).Scan(&text))
	r, ok := keyspace.ParseRecord(string(text))
	if !ok {
		s.t.Fatalf("%s holds no record: %q", rec, text)
	}
	r.State, r.Owner, r.Fence = "run", "an-executor-that-died", strconv.FormatInt(time.Now().Add(-ago).UnixMicro(), 10)
	r.Status, r.Header, r.Body = "", "", ""
	_, err := s.db.Exec("UPDATE "+s.keys+" SET record = ? WHERE id = ?", []byte(r.String()), rec)
	must(s.t, err)
	return rec
}

func (s *sqlService) idemctl(stdin string, withDB bool, args ...string) result {
	s.t.Helper()
	flags := []string{"-store", "sqlite:" + s.path, "-store-table", s.keys, "-prefix", s.prefix}
	if withDB {
		flags = append(flags, "-db", s.db.DSN, "-table", s.outcomes)
	}
	return runBinary(s.t, stdin, append(flags, args...)...)
}

// idemctl -store reads and settles the keys of a middleware made by
// NewSQL as it does Redis's: it shows and lists the interrupted ones,
// replays an answer SQL committed, and forgets a key so that its retry
// runs again.
func TestSQLStore(t *testing.T) {
	s := newSQLService(t)
	if r := s.post("/transfers", "t1"); r.status != http.StatusCreated {
		t.Fatalf("first transfer: %d %s", r.status, r.body)
	}
	transfer := s.abandon("t1", 10*time.Minute)
	if r := s.post("/transfers", "t1"); r.status != http.StatusConflict {
		t.Fatalf("retry of an interrupted key: %d %s", r.status, r.body)
	}
	s.hang.Store(true)
	s.post("/plain", "p1")
	s.hang.Store(false)
	plain := s.record("p1")

	for _, name := range []string{transfer, strings.TrimSuffix(transfer, "r") + "l"} {
		expect(t, s.idemctl("", true, "show", name), 0, "key          "+transfer+"\n", "run, interrupted",
			"claimed      10m", "by the database's clock", "lock         free", "committed answer, status 201",
			"idemctl resolve -replay '"+transfer+"'")
	}
	expect(t, s.idemctl("", false, "show", plain), 0, "run, interrupted", "maybe still running")
	r := s.idemctl("", true, "interrupted")
	expect(t, r, 0, transfer+"  fence=", "age=10m", "sql=answer", plain+"  fence=", "sql=none")
	if !strings.Contains(r.stderr, "2 interrupted key(s)") {
		t.Errorf("stderr %q lacks the count", r.stderr)
	}

	expect(t, s.idemctl("", true, "resolve", "-replay", transfer), 1, "Store that answer in the keys table")
	expect(t, s.idemctl("yes\n", true, "resolve", "-replay", transfer), 0, "Replayed: "+transfer+" now answers status 201")
	retry := s.post("/transfers", "t1")
	if retry.status != http.StatusCreated || retry.body != "transfer 1" || !retry.replayed || retry.header.Get("X-Transfer") != "1" {
		t.Errorf("retry after resolve -replay: %+v, want the first answer replayed", retry)
	}
	if n := s.transfers.Load(); n != 1 {
		t.Errorf("%d transfers ran", n)
	}

	r = s.idemctl("", false, "resolve", "-forget", "-yes", plain)
	expect(t, r, 1)
	if !strings.Contains(r.stderr, "less than -min-age") || !strings.Contains(r.stderr, "a stall of the keys table") {
		t.Errorf("a key claimed just now: %q", r.stderr)
	}
	expect(t, s.idemctl("", false, "resolve", "-forget", "-yes", "-force", plain), 0, "Forgotten: "+plain)
	if r := s.post("/plain", "p1"); r.status != http.StatusAccepted || r.replayed || s.plains.Load() != 2 {
		t.Errorf("retry after resolve -forget: %+v after %d runs; want it run again", r, s.plains.Load())
	}

	r = s.idemctl("", false, "interrupted")
	expect(t, r, 0)
	if r.stdout != "" || !strings.Contains(r.stderr, "0 interrupted key(s)") {
		t.Errorf("no key is interrupted any more: %q %q", r.stdout, r.stderr)
	}
	r = s.idemctl("yes\n", false, "resolve", "-forget", "-force", transfer)
	if r.code != 1 || !strings.Contains(r.stderr, "is not interrupted (done); nothing changed") {
		t.Errorf("resolve of a resolved key: exit %d, %q", r.code, r.stderr)
	}
}

func TestSQLStoreUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-store", "sqlite:x.db", "-redis", "redis://127.0.0.1:1", "show", "K"}, "not both"},
		{[]string{"-store", "sqlite:x.db", "token-keys"}, "pass -redis, not -store"},
		{[]string{"-store", "x.db", "show", "K"}, "-store: name the database by its URL"},
		{[]string{"-store", "sqlite:x.db", "-store-table", "a;b", "show", "K"}, "-store-table"},
		{[]string{"-store", "mysql://u@h/db?bogus=%zz", "show", "K"}, "-store"},
	} {
		r := runBinary(t, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

// A SQLite file that is not there is named, and not created: a mistyped
// path must not leave an empty database behind.
func TestASQLiteFileThatIsNotThere(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none.db")
	for _, flag := range []string{"-store", "-db"} {
		args := []string{flag, "sqlite:" + path, "interrupted"}
		if flag == "-db" {
			args = []string{"-redis", "redis://127.0.0.1:1", "-db", "sqlite:" + path, "interrupted"}
		}
		r := runBinary(t, "", args...)
		if r.code == 0 || !strings.Contains(r.stderr, "no SQLite database at "+path) {
			t.Errorf("%s: exit %d, %q; want the missing file named", flag, r.code, r.stderr)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: %s was created (%v)", flag, path, err)
		}
	}
}

// A token's record, forgotten, keeps its token spent: idemctl says a retry
// is refused, not that it runs the handler.
func TestATokensRecordIsToldApart(t *testing.T) {
	for name, want := range map[string]bool{
		"idem:{tAbC_-x}:r:v1.ZmFrZQ.c2ln":  true,
		"app:{x}:idem:{tQ}:r:tok":          true,
		"idem:{kbQnsaXpLyQtRdmppGhjoKg}:r": false,
		"idem:{fQ}:r":                      false,
		"idem:{t}:r":                       false, // no token after it: not a record name idemctl takes
	} {
		if got := tokenRecord(name); got != want {
			t.Errorf("tokenRecord(%q) = %v, want %v", name, got, want)
		}
	}
	st := admin.KeyState{Key: "idem:{tQ}:r:tok", State: "none"}
	if v := verdict(st, nil, 0, 0); !strings.Contains(v, "422 token-not-found") {
		t.Errorf("verdict of a token's forgotten record: %q", v)
	}
}
