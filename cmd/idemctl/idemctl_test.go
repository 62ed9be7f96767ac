package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/redis/go-redis/v9"
)

// binary is idemctl, built once for every test, so that the tests run the
// command as an operator does: flags, stdin, output and exit status.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "idemctl")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	out, err := exec.CommandContext(ctx, goTool(), "build", "-o", binary, ".").CombinedOutput()
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building idemctl: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	redistest.Main(m, func() { os.RemoveAll(dir) })
}

// goTool is the go command that runs these tests.
func goTool() string {
	if path, err := exec.LookPath("go"); err == nil {
		return path
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}

// service is a transfer route as a service runs it, on a real Redis and a
// SQLite file: /transfers commits its answer through sqlidem, and /plain is
// a route without SQL, /slow one whose handler waits for the test. durable
// recovers abandoned executions from the outcome store; plain is the same
// service without it, so that what answers a retry there is Redis alone.
type service struct {
	t              *testing.T
	rdb            redis.UniversalClient
	prefix, table  string
	db             *sqltest.DB
	durable, plain *httptest.Server
	transfers      atomic.Int64 // transfer transactions that ran
	handled        atomic.Int64 // requests that reached a handler through plain

	entered, release chan struct{} // /slow's handler has started; let it finish

	mu   sync.Mutex
	keys map[string]string // Execution.Key by Idempotency-Key
}

func newService(t *testing.T) *service {
	t.Helper()
	s := &service{t: t, keys: map[string]string{}, entered: make(chan struct{}, 1), release: make(chan struct{})}
	s.prefix = "idemctl-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	s.rdb = redistest.Client(t, s.prefix)
	s.db = sqltest.Open(t, sqltest.SQLite)
	s.table = s.db.Table(t, "outcomes")
	outcomes, err := sqlidem.New(s.db.DB, sqlidem.SQLite, sqlidem.WithTable(s.table))
	must(t, err)
	must(t, outcomes.CreateTable(t.Context()))
	_, err = s.db.Exec("CREATE TABLE transfers (n INTEGER NOT NULL)")
	must(t, err)

	// Every request goes to Redis, as on another instance: an in-process
	// cache would answer what the tests make Redis forget.
	opts := []idempotency.Option{idempotency.WithKeyPrefix(s.prefix), idempotency.WithCallerCredentials(), idempotency.WithResponseCache(0, 0)}
	durable := idempotency.New(s.rdb, append(opts, idempotency.WithOutcomeStore(outcomes))...)
	plain := idempotency.New(s.rdb, opts...)
	transfer := outcomes.Handler(s.transfer)

	mux := http.NewServeMux()
	mux.Handle("POST /transfers", durable.ProtectKey(s.remember(transfer)))
	s.durable = httptest.NewServer(mux)
	t.Cleanup(s.durable.Close)

	mux = http.NewServeMux()
	mux.Handle("POST /transfers", plain.ProtectKey(s.remember(s.count(transfer))))
	mux.Handle("POST /plain", plain.ProtectKey(s.remember(s.count(http.HandlerFunc(answer)))))
	mux.Handle("POST /slow", plain.ProtectKey(s.remember(http.HandlerFunc(s.slow))))
	s.plain = httptest.NewServer(mux)
	t.Cleanup(s.plain.Close)
	return s
}

func (s *service) transfer(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
	n := s.transfers.Add(1)
	if _, err := tx.ExecContext(r.Context(), "INSERT INTO transfers (n) VALUES (?)", n); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Transfer", strconv.FormatInt(n, 10))
	w.Header()["ETag"] = []string{`"transfer-` + strconv.FormatInt(n, 10) + `"`} // not canonical: net/http sends it as written
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"transfer":%d}`, n)
	return nil
}

func answer(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusAccepted)
	io.WriteString(w, "accepted")
}

// slow is a handler that runs until the test releases it.
func (s *service) slow(w http.ResponseWriter, r *http.Request) {
	s.entered <- struct{}{}
	<-s.release
	w.WriteHeader(http.StatusAccepted)
}

// remember notes the record of each protected execution (Execution.Key).
func (s *service) remember(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e, ok := idempotency.ExecutionOf(r.Context()); ok {
			s.mu.Lock()
			s.keys[r.Header.Get(idempotency.KeyHeader)] = e.Key
			s.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

func (s *service) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.handled.Add(1)
		next.ServeHTTP(w, r)
	})
}

// record is the Redis key of the client's key's record, as the middleware
// logs it: its Execution.Key, and the outcome table's record_key.
func (s *service) record(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.keys[key]
	if !ok {
		s.t.Fatalf("no execution of key %q", key)
	}
	return d
}

type reply struct {
	status   int
	body     string
	replayed bool
	header   http.Header
}

func (s *service) post(srv *httptest.Server, path, key string) reply {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{"amount":5}`))
	req.Header.Set(idempotency.KeyHeader, key)
	c := &http.Client{Timeout: 30 * time.Second}
	res, err := c.Do(req)
	must(s.t, err)
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return reply{res.StatusCode, string(body), res.Header.Get(idempotency.ReplayedHeader) == "true", res.Header}
}

// abandon makes key's record read as an execution whose instance stopped
// before it stored an answer, claimed ago: under a lock value nobody
// holds, and with the fence (Redis TIME in microseconds) of that claim.
func (s *service) abandon(key string, ago time.Duration) string {
	s.t.Helper()
	ctx := s.t.Context()
	rec := s.record(key)
	now, err := s.rdb.Time(ctx).Result()
	must(s.t, err)
	fence := strconv.FormatInt(now.Add(-ago).UnixMicro(), 10)
	must(s.t, redistest.EditRecord(ctx, s.rdb, rec, func(r *keyspace.Record) {
		r.State, r.Owner, r.Fence = "run", "an-executor-that-died", fence
		r.Status, r.Header, r.Body = "", "", ""
	}))
	return rec
}

func (s *service) state(rec string) string {
	return redistest.RecordState(s.t.Context(), s.rdb, rec)
}

// result is what a run of idemctl printed and how it exited.
type result struct {
	stdout, stderr string
	code           int
}

// idemctl runs the command on the service's Redis, under its prefix;
// withDB adds its database.
func (s *service) idemctl(stdin string, withDB bool, args ...string) result {
	s.t.Helper()
	flags := []string{"-redis", redisURL(s.t), "-prefix", s.prefix}
	if withDB {
		flags = append(flags, "-db", s.db.DSN, "-table", s.table)
	}
	return runBinary(s.t, stdin, append(flags, args...)...)
}

func runBinary(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Stdin = strings.NewReader(stdin)
	// The connection is named by flags only.
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); name != "REDIS_URL" && name != "REDIS_CLUSTER_ADDRS" && name != "DATABASE_URL" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("running idemctl %v: %v", args, err)
	}
	r := result{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
	t.Logf("$ idemctl %s\n%s%s(exit %d)", strings.Join(args, " "), r.stdout, r.stderr, r.code)
	return r
}

// redisURL names the tests' shared Redis for the command.
func redisURL(t *testing.T) string {
	if raw := os.Getenv("REDIS_URL"); raw != "" {
		return raw
	}
	opts, err := redistest.SharedOptions()
	must(t, err)
	return redistest.URL(opts)
}

func TestReplay(t *testing.T) {
	s := newService(t)
	first := s.post(s.durable, "/transfers", "t1")
	if first.status != http.StatusCreated {
		t.Fatalf("first transfer: %d %s", first.status, first.body)
	}
	rec := s.abandon("t1", 10*time.Minute)
	lock := strings.TrimSuffix(rec, "r") + "l"
	if r := s.post(s.plain, "/transfers", "t1"); r.status != http.StatusConflict {
		t.Fatalf("retry of an interrupted key without an outcome store: %d %s", r.status, r.body)
	}

	// The record's name or its lock's shows it; the commands it suggests
	// name the record.
	for _, name := range []string{rec, lock} {
		r := s.idemctl("", true, "show", name)
		expect(t, r, 0, "key          "+rec+"\n", "run, interrupted",
			"claimed      10m", "SQL holds a committed answer", "idemctl resolve -replay '"+rec+"'",
			"committed answer, status 201")
	}
	r := s.idemctl("", true, "interrupted")
	expect(t, r, 0, rec+"  fence=", "age=10m", "executions=1", "sql=answer")
	if !strings.Contains(r.stderr, "1 interrupted key(s)") {
		t.Errorf("stderr %q lacks the count", r.stderr)
	}

	for _, stdin := range []string{"", "no\n", "y\n"} {
		r = s.idemctl(stdin, true, "resolve", "-replay", rec)
		expect(t, r, 1, "claimed 10m", "Type yes to go on")
		if !strings.Contains(r.stderr, "not confirmed; nothing changed") || s.state(rec) != "run" {
			t.Fatalf("stdin %q: the key changed without confirmation: %q, state %q", stdin, r.stderr, s.state(rec))
		}
	}
	r = s.idemctl("yes\n", true, "resolve", "-replay", lock)
	expect(t, r, 0, "Replayed: "+rec+" now answers status 201")

	retry := s.post(s.plain, "/transfers", "t1")
	if retry.status != http.StatusCreated || retry.body != first.body || !retry.replayed || retry.header.Get("X-Transfer") != "1" {
		t.Errorf("retry after resolve -replay: %+v, want the first answer %q replayed", retry, first.body)
	}
	if etag := retry.header.Get("ETag"); etag != `"transfer-1"` {
		t.Errorf("retry after resolve -replay: ETag %q; want the one the handler set as h[\"ETag\"]", etag)
	}
	if n, h := s.transfers.Load(), s.handled.Load(); n != 1 || h != 0 {
		t.Errorf("%d transfers ran and %d requests reached the handler; want 1 and 0", n, h)
	}
	r = s.idemctl("", true, "interrupted")
	expect(t, r, 0)
	if r.stdout != "" {
		t.Errorf("no key is interrupted any more, got %q", r.stdout)
	}
}

// An execution whose answer was too large to keep committed as executed:
// resolve -replay settles its key as executed, not replayable.
func TestReplayNotReplayable(t *testing.T) {
	s := newService(t)
	if r := s.post(s.durable, "/transfers", "big"); r.status != http.StatusCreated {
		t.Fatalf("first transfer: %d %s", r.status, r.body)
	}
	rec := s.abandon("big", time.Hour)
	_, err := s.db.Exec("UPDATE "+s.table+" SET state = 'executed', header = '', body = NULL WHERE record_key = ?", rec)
	must(t, err)
	expect(t, s.idemctl("", true, "show", rec), 0, "executed, status 201, its answer too large to keep",
		"SQL holds a committed answer")
	expect(t, s.idemctl("", true, "resolve", "-replay", "-yes", rec), 0,
		"its answer was too large to keep", "Settled: "+rec+" now answers 409 not-replayable")
	if r := s.post(s.plain, "/transfers", "big"); r.status != http.StatusConflict || !strings.Contains(r.body, "not-replayable") {
		t.Errorf("retry after resolve -replay: %d %s; want 409 not-replayable", r.status, r.body)
	}
	if n := s.transfers.Load(); n != 1 {
		t.Errorf("%d transfers ran", n)
	}
}

// -replay-headers stores only the service's allowlist, as its
// WithReplayHeaders would; without it, the middleware's default policy.
func TestReplayHeaders(t *testing.T) {
	s := newService(t)
	for _, key := range []string{"all", "some"} {
		if r := s.post(s.durable, "/transfers", key); r.status != http.StatusCreated {
			t.Fatalf("first transfer: %d %s", r.status, r.body)
		}
	}
	all, some := s.abandon("all", time.Hour), s.abandon("some", time.Hour)
	expect(t, s.idemctl("", true, "resolve", "-replay", "-yes", all), 0, "Replayed")
	expect(t, s.idemctl("", true, "resolve", "-replay", "-yes", "-replay-headers", "content-type,etag", some), 0, "Replayed")
	if r := s.post(s.plain, "/transfers", "all"); !r.replayed || r.header.Get("X-Transfer") != "1" || r.header.Get("ETag") == "" {
		t.Errorf("replayed with the default policy: %+v", r)
	}
	r := s.post(s.plain, "/transfers", "some")
	if !r.replayed || r.header.Get("X-Transfer") != "" || r.header.Get("Content-Type") != "application/json" || r.header.Get("ETag") != `"transfer-2"` {
		t.Errorf("replayed with -replay-headers Content-Type,ETag: %+v", r)
	}
}

func TestForget(t *testing.T) {
	s := newService(t)
	if r := s.post(s.plain, "/plain", "p1"); r.status != http.StatusAccepted {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	rec := s.abandon("p1", 3*time.Minute)

	expect(t, s.idemctl("", false, "show", rec), 0, "its outcome is unknown", "resolve -forget '"+rec+"'")
	expect(t, s.idemctl("", true, "show", rec), 0, "SQL", "no row for this key", "SQL holds no committed answer")
	expect(t, s.idemctl("", true, "interrupted"), 0, rec, "sql=none")

	r := s.idemctl("", false, "resolve", "-forget", rec)
	expect(t, r, 1, "Delete its record")
	if s.state(rec) != "run" {
		t.Fatal("forgotten without confirmation")
	}
	expect(t, s.idemctl("", false, "resolve", "-forget", "-yes", rec), 0, "Forgotten: "+rec)

	retry := s.post(s.plain, "/plain", "p1")
	if retry.status != http.StatusAccepted || retry.replayed || s.handled.Load() != 2 {
		t.Errorf("retry after resolve -forget: %+v after %d executions; want it run again", retry, s.handled.Load())
	}
}

func TestResolveRefusesKeysNotInterrupted(t *testing.T) {
	s := newService(t)
	ctx := t.Context()
	if r := s.post(s.durable, "/transfers", "done"); r.status != http.StatusCreated {
		t.Fatalf("first transfer: %d %s", r.status, r.body)
	}
	done := s.record("done")
	body := s.rdb.Get(ctx, done).Val()

	// Running: claimed under a lock value that the lock still holds.
	runningRecord := strings.Replace(done, "{k", "{kRunning", 1)
	running := strings.TrimSuffix(runningRecord, ":r") + ":l"
	must(t, s.rdb.Set(ctx, runningRecord, keyspace.Record{State: "run", Fingerprint: "x", Owner: "alive",
		Fence: "7", Executions: "1"}.String(), time.Hour).Err())
	must(t, s.rdb.Set(ctx, running, "alive", time.Hour).Err())

	for _, tc := range []struct {
		key, state string
		args       []string
	}{
		{done, "done", []string{"-replay"}},
		{done, "done", []string{"-forget"}},
		{runningRecord, "run: its executor holds the lock", []string{"-replay"}},
		{running, "run: its executor holds the lock", []string{"-forget"}},
		{strings.Replace(done, "{k", "{kNever", 1), "none: no record", []string{"-forget"}},
	} {
		r := s.idemctl("yes\n", true, append(append([]string{"resolve"}, tc.args...), tc.key)...)
		if r.code != 1 || !strings.Contains(r.stderr, "is not interrupted ("+tc.state+"); nothing changed") {
			t.Errorf("resolve %v %s: exit %d, %q", tc.args, tc.key, r.code, r.stderr)
		}
	}
	if s.state(done) != "done" || s.rdb.Get(ctx, done).Val() != body || s.state(runningRecord) != "run" {
		t.Error("a refused resolve changed a record")
	}
	expect(t, s.idemctl("", true, "show", running), 0, "running: wait for its executor", "held by its executor")
}

func TestUsageExitsTwo(t *testing.T) {
	r := runBinary(t, "", "resolve", "-redis", "redis://127.0.0.1:1", "some-key")
	if r.code != 2 || !strings.Contains(r.stderr, "one of -replay and -forget") {
		t.Errorf("exit %d, %q", r.code, r.stderr)
	}
	r = runBinary(t, "", "-h")
	if r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
		t.Errorf("-h: exit %d, %q", r.code, r.stdout)
	}
}

// expect checks a run's exit status and that its output holds each of want.
func expect(t *testing.T, r result, code int, want ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("output lacks %q:\n%s", w, r.stdout)
		}
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A key that holds no record this version can read is shown as such, and
// nothing offers to settle it.
func TestShowUnreadableRecord(t *testing.T) {
	s := newService(t)
	if r := s.post(s.durable, "/transfers", "x"); r.status != http.StatusCreated {
		t.Fatalf("first transfer: %d %s", r.status, r.body)
	}
	rec := strings.Replace(s.record("x"), "{k", "{kCorrupt", 1)
	must(t, s.rdb.HSet(t.Context(), rec, "st", "done").Err())
	must(t, s.rdb.Expire(t.Context(), rec, time.Hour).Err())
	expect(t, s.idemctl("", true, "show", rec), 0, "corrupt: a record this version cannot read", "unreadable-record")
}
