package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/onceonly/idempotency/bench/peers/peer"
)

// Keys in PostgreSQL, side by side: this library with NewSQL and
// idemlease v1.1.0 with its pgstore (when -idemlease names its tree), each
// a server of its own on a table of its own in the same PostgreSQL, in
// front of the same trivial handler and under the same wrk load as the
// Redis run, in interleaved rounds. The PostgreSQL is the one -postgres
// names, shared with whatever else uses it: the run creates its two tables
// under names of its own (sidebyside_NAME_PID), empties only them, and
// drops them at the end.
//
// Statements are counted at each server's database/sql driver
// (bench/peers/peer), per request of each case and over every measured
// run. CPU is the server's process and the PostgreSQL backends serving
// its connections (found by their application_name), from /proc; the
// server's background processes (WAL writer, checkpointer, autovacuum)
// are not in it. Then, for each server's table, its size after
// -sizing-rows first executions, and, for this library's, the time its
// purge statement takes to delete 1,000 expired rows.

var pgKinds = []kind{
	{
		Name: "ours", Title: "this library",
		What: "idempotency.NewSQL(db, idempotency.PostgreSQL, WithCallerCredentials(), WithSQLTable(...)).ProtectKey, " +
			"pgx v5 through database/sql, at most 64 connections, all kept when idle",
		Package:      "github.com/onceonly/idempotency/bench/peers/ourspg",
		UsesPostgres: true,
		Replay:       replayedByUs,
	},
}

var idemleasePGKind = kind{
	Name: "idemlease", Title: "idemlease",
	What: "github.com/repenguin22/idemlease " + idemleaseVersion + " itself: pgstore.Schema run at start-up, then " +
		"httpidem.New(pgstore.New(db, pgstore.Table(...)), Require(true)), pgstore " + idemleaseVersion +
		", every other option at its default (a 30 s lease, never renewed; records kept 24 h; a SHA-256 " +
		"fingerprint; 409 while a key runs; fail-closed); pgx v5 through database/sql, the same pool",
	Package:      "github.com/onceonly/idempotency/bench/peers/idemleasepg",
	UsesPostgres: true,
	Replay: func(resp *http.Response, body, first []byte) bool {
		return resp.Header.Get("Idempotency-Replayed") == "true" && string(body) == string(first)
	},
	ReplayHeader: "Idempotency-Replayed",
	source:       "peers/idemleasepg/main.go",
	stores:       []string{"pgstore"},
	pins:         []string{"github.com/jackc/pgx/v5"},
}

// pg is the PostgreSQL of a -store postgres run.
var pg pgConfig

// A pgConfig is a PostgreSQL's URL and each server's table in it.
type pgConfig struct {
	dsn    string
	tables map[string]string
}

// appName is the application_name of an instance ("ours-a").
func appName(instance string) string { return "sidebyside-" + instance }

// dsnFor is the URL with which an instance connects, named so that its
// backends can be found.
func (p *pgConfig) dsnFor(instance string) string {
	u, err := url.Parse(p.dsn)
	if err != nil {
		return p.dsn
	}
	q := u.Query()
	q.Set("application_name", appName(instance))
	u.RawQuery = q.Encode()
	return u.String()
}

func postgresMain(cfg config, tree string) error {
	if cfg.postgres == "" {
		return errors.New("-store postgres: set -postgres or POSTGRES_DSN")
	}
	peer.MustLoopbackDSN(cfg.postgres)
	if cfg.sizingRows < 1_000 || cfg.sizingRows > 200_000 {
		return errors.New("-sizing-rows: 1000–200000")
	}
	kinds = slices.Clone(pgKinds)
	if tree == "" {
		log.Printf("sidebyside: IDEMLEASE_DIR is not set: idemlease is left out (the module proxy does not serve it)")
	} else {
		k, err := inTree(idemleasePGKind, tree)
		if err != nil {
			return err
		}
		kinds = append(kinds, k)
	}
	if err := cfg.check(len(kinds) * 2); err != nil {
		return err
	}
	pg.dsn, pg.tables = cfg.postgres, map[string]string{}
	for _, k := range kinds {
		pg.tables[k.Name] = fmt.Sprintf("sidebyside_%s_%d", k.Name, os.Getpid())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	return withCause(ctx, runPostgres(ctx, cfg))
}

// pgReport is the JSON of a -store postgres run.
type pgReport struct {
	Date       string                       `json:"date"`
	Machine    machine                      `json:"machine"`
	PostgreSQL string                       `json:"postgresql_version"`
	Go         string                       `json:"go_version"`
	Wrk        string                       `json:"wrk_version"`
	Library    string                       `json:"library"`
	Versions   map[string]map[string]string `json:"versions"`
	Servers    []kind                       `json:"servers"`
	Tables     map[string]string            `json:"tables"`
	Load       load                         `json:"load"`
	Runs       []run                        `json:"runs"`
	Medians    []pgMedian                   `json:"medians"`
	Counts     []sqlCount                   `json:"statements_per_request"`
	Sizes      []tableSize                  `json:"table_sizes"`
	Purges     []purgeCost                  `json:"purges"`
	Seconds    float64                      `json:"seconds"`
}

type pgMedian struct {
	median
	// Statements per answer over the measured runs, median of the rounds.
	Statements float64 `json:"statements_per_answer"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
}

func runPostgres(ctx context.Context, cfg config) error {
	dir, scripts, cleanup, err := prepare(cfg, map[string][]byte{"first": newkeyLua, "duplicates": samekeyLua})
	if err != nil {
		return err
	}
	defer cleanup()
	started := time.Now()
	db, err := sql.Open("pgx", pg.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("PostgreSQL at -postgres: %w", err)
	}
	defer dropTables(db)

	log.Printf("building the servers")
	builds, err := buildServers(ctx, dir)
	if err != nil {
		return err
	}
	rep := &pgReport{
		Date:     time.Now().UTC().Format(time.RFC3339),
		Machine:  machine{CPU: cpuModel(), Cores: runtime.NumCPU(), Note: "servers, PostgreSQL and wrk share the cores"},
		Go:       runtime.Version(),
		Wrk:      wrkVersion(),
		Library:  libraryState(ctx),
		Versions: builds,
		Servers:  kinds,
		Tables:   pg.tables,
	}
	if err := db.QueryRowContext(ctx, "SHOW server_version").Scan(&rep.PostgreSQL); err != nil {
		return err
	}
	rep.PostgreSQL = "PostgreSQL " + strings.Fields(rep.PostgreSQL)[0]
	var settings []string
	for _, name := range []string{"synchronous_commit", "fsync", "shared_buffers"} {
		var v string
		if err := db.QueryRowContext(ctx, "SELECT current_setting($1)", name).Scan(&v); err == nil {
			settings = append(settings, name+" "+v)
		}
	}
	rep.PostgreSQL += " (" + strings.Join(settings, ", ") + ")"
	rep.Load = load{
		Measured: "wrk " + strings.Join(wrkArgs(cfg.threads, cfg.conns, cfg.duration, true, "SCRIPT", "URL", "ARG"), " "),
		Warmup:   "wrk " + strings.Join(wrkArgs(cfg.threads, cfg.conns, cfg.warmup, false, "SCRIPT", "URL", "ARG"), " "),
		Rounds:   cfg.rounds,
		Order:    "round r starts with server r (" + kindNames() + "), each server's two workloads back to back on its emptied table",
		First:    "bench/sidebyside/newkey.lua: POST /payments, a new Idempotency-Key per request (ARG: a prefix per round)",
		Dups:     "bench/sidebyside/samekey.lua: POST /payments, every connection repeating one key (ARG) after one first call",
		Counts:   fmt.Sprintf("%d sequential requests per case, statements counted at each server's driver", cfg.count),
	}
	lifetime := cfg.timeout + time.Minute

	log.Printf("counting statements per request")
	if rep.Counts, err = countSQL(ctx, cfg, dir, lifetime); err != nil {
		return err
	}
	log.Printf("throughput: %d rounds × %d servers × 2 workloads", cfg.rounds, len(kinds))
	insts := map[string]*instance{}
	for _, k := range kinds {
		in, err := startInstance(ctx, dir, k, "a", "", lifetime)
		if err != nil {
			return err
		}
		defer in.stop()
		insts[k.Name] = in
	}
	for round := 1; round <= cfg.rounds; round++ {
		order := slices.Concat(kinds[(round-1)%len(kinds):], kinds[:(round-1)%len(kinds)])
		for _, k := range order {
			if err := truncate(ctx, db, k); err != nil {
				return err
			}
			for _, workload := range []string{"first", "duplicates"} {
				r, err := measure(ctx, cfg, k, insts[k.Name], pgMeter(db), round, workload, scripts[workload])
				if err != nil {
					return err
				}
				rep.Runs = append(rep.Runs, r)
				log.Printf("  round %d %-9s %-10s %8.0f req/s  p50 %6.3f ms  %5.2f statements  CPU %4.0f + %4.0f µs  %s",
					round, k.Name, workload, r.RPS, r.P50ms, perAnswer(r), r.ServerCPU, r.RedisCPU,
					map[bool]string{true: "ok", false: "NOT OK: " + r.Problem}[r.OK])
			}
		}
	}
	rep.summarise()

	log.Printf("table sizes after %d first executions", cfg.sizingRows)
	for _, k := range kinds {
		size, err := sizeTable(ctx, cfg, db, k, insts[k.Name])
		if err != nil {
			return err
		}
		rep.Sizes = append(rep.Sizes, size)
		log.Printf("  %-9s %d rows: %.0f bytes per row on disk (%.0f in the row itself)", k.Name, size.Rows, size.PerRow, size.RowBytes)
	}
	log.Printf("purges of 1000 expired rows")
	if rep.Purges, err = purges(ctx, db, cfg.sizingRows); err != nil {
		return err
	}
	rep.Seconds = time.Since(started).Seconds()

	if err := publish(rep, rep.markdown(), cfg.out, cfg.docs, pgBegin, pgEnd); err != nil {
		return err
	}
	var bad []string
	for _, r := range rep.Runs {
		if !r.OK {
			bad = append(bad, fmt.Sprintf("round %d, %s, %s: %s", r.Round, r.Server, r.Workload, r.Problem))
		}
	}
	for _, c := range rep.Counts {
		if c.Unexpected > 0 {
			bad = append(bad, fmt.Sprintf("count, %s, %s: %s", c.Server, c.Case, strings.Join(c.Problems, "; ")))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("unexpected answers:\n  %s", strings.Join(bad, "\n  "))
	}
	return nil
}

const (
	pgBegin = "<!-- sidebyside-postgres:begin -->"
	pgEnd   = "<!-- sidebyside-postgres:end -->"
)

// truncate empties k's table, which the run created (ours creates its
// table on its first request: until then there is none to empty).
func truncate(ctx context.Context, db *sql.DB, k kind) error {
	_, err := db.ExecContext(ctx, "DO $$ BEGIN IF to_regclass('"+pg.tables[k.Name]+"') IS NOT NULL THEN "+
		"EXECUTE 'TRUNCATE "+pg.tables[k.Name]+"'; END IF; END $$")
	return err
}

// dropTables drops the tables the run created, whatever ended it.
func dropTables(db *sql.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stopChildren() // no server holds a connection to them
	for _, table := range pg.tables {
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
			log.Printf("sidebyside: dropping %s: %v", table, err)
		}
	}
}

func perAnswer(r run) float64 {
	if r.Answers == 0 {
		return 0
	}
	return float64(r.Statements) / float64(r.Answers)
}

// summarise computes the medians of the rounds and this library's ratio
// to idemlease.
func (rep *pgReport) summarise() {
	for _, w := range []string{"first", "duplicates"} {
		for _, k := range kinds {
			m := pgMedian{median: median{Server: k.Name, Workload: w}}
			var server, backends, wrk, statements, p50, p99 []float64
			for _, r := range rep.Runs {
				if r.Server == k.Name && r.Workload == w {
					m.Rounds, m.Non2xx = append(m.Rounds, r.RPS), append(m.Non2xx, r.Non2xx)
					server, backends, wrk = append(server, r.ServerCPU), append(backends, r.RedisCPU), append(wrk, r.WrkCPU)
					statements, p50, p99 = append(statements, perAnswer(r)), append(p50, r.P50ms), append(p99, r.P99ms)
				}
			}
			m.RPS, m.ServerCPU, m.RedisCPU, m.WrkCPU = medianOf(m.Rounds), medianOf(server), medianOf(backends), medianOf(wrk)
			m.Statements, m.P50ms, m.P99ms = medianOf(statements), medianOf(p50), medianOf(p99)
			rep.Medians = append(rep.Medians, m)
		}
	}
	for i := range rep.Medians {
		m := &rep.Medians[i]
		if il := rep.median(idemleasePGKind.Name, m.Workload); il.RPS > 0 {
			m.VsIdemlease = m.RPS / il.RPS
		}
	}
}

func (rep *pgReport) median(server, workload string) pgMedian {
	for _, m := range rep.Medians {
		if m.Server == server && m.Workload == workload {
			return m
		}
	}
	return pgMedian{}
}

// A sqlCount is what one server sends to the database per request in one
// case.
type sqlCount struct {
	Server     string             `json:"server"`
	Case       string             `json:"case"`
	Requests   int                `json:"requests"`
	Statements float64            `json:"statements_per_request"`
	ByVerb     map[string]float64 `json:"statements_per_request_by_verb"`
	Unexpected int                `json:"unexpected_answers"`
	Problems   []string           `json:"problems,omitempty"`
}

func (c *sqlCount) problem(p string) {
	c.Unexpected++
	if len(c.Problems) < 5 {
		c.Problems = append(c.Problems, p)
	}
}

// countSQL runs, per server, sequential requests of each case through two
// instances and reads the statements they sent.
func countSQL(ctx context.Context, cfg config, dir string, lifetime time.Duration) ([]sqlCount, error) {
	var counts []sqlCount
	for _, k := range kinds {
		a, err := startInstance(ctx, dir, k, "count-a", "", lifetime)
		if err != nil {
			return nil, err
		}
		b, err := startInstance(ctx, dir, k, "count-b", "", lifetime)
		if err != nil {
			a.stop()
			return nil, err
		}
		// The table is created, pools connect and a first purge runs on
		// the first requests: not counted.
		for i := range 3 {
			key := fmt.Sprintf("%s-warm-%d", k.Name, i)
			for _, in := range []*instance{a, a, b} {
				post(in.url(), key)
			}
		}
		time.Sleep(300 * time.Millisecond)
		for _, c := range countCases {
			sc, err := countSQLCase(cfg, k, c.name, a, b)
			if err != nil {
				a.stop()
				b.stop()
				return nil, err
			}
			counts = append(counts, sc)
			log.Printf("  %-9s %-9s %5.2f statements per request %v", k.Name, c.name, sc.Statements, sc.ByVerb)
		}
		a.stop()
		b.stop()
	}
	return counts, nil
}

func countSQLCase(cfg config, k kind, name string, a, b *instance) (sqlCount, error) {
	sc := sqlCount{Server: k.Name, Case: name, Requests: cfg.count}
	keys := make([]string, cfg.count)
	firsts := make([][]byte, cfg.count)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%s-%d", k.Name, name, i)
	}
	target := a
	if name != "first" {
		for i, key := range keys {
			resp, body, err := post(a.url(), key)
			if err != nil {
				return sc, err
			}
			if resp.StatusCode != http.StatusCreated {
				sc.problem(fmt.Sprintf("first call of %s answered %d", key, resp.StatusCode))
			}
			firsts[i] = body
		}
		if name == "dup-other" {
			target = b
		}
	}
	both := func() (int64, map[string]int64, error) {
		sa, err := a.stats()
		if err != nil {
			return 0, nil, err
		}
		sb, err := b.stats()
		if err != nil {
			return 0, nil, err
		}
		verbs := map[string]int64{}
		for _, s := range []peer.Stats{sa, sb} {
			for v, n := range s.ByVerb {
				verbs[v] += n
			}
		}
		return sa.Statements + sb.Statements, verbs, nil
	}
	time.Sleep(50 * time.Millisecond)
	n0, v0, err := both()
	if err != nil {
		return sc, err
	}
	for i, key := range keys {
		resp, body, err := post(target.url(), key)
		if err != nil {
			return sc, err
		}
		switch {
		case resp.StatusCode != http.StatusCreated:
			sc.problem(fmt.Sprintf("%s answered %d", key, resp.StatusCode))
		case name == "first" && resp.Header.Get(k.replayHeader()) != "":
			sc.problem(fmt.Sprintf("%s: a first execution marked a replay", key))
		case name != "first" && !k.Replay(resp, body, firsts[i]):
			sc.problem(fmt.Sprintf("%s: not a replay of the first answer", key))
		}
	}
	time.Sleep(50 * time.Millisecond) // anything a server sends after answering
	n1, v1, err := both()
	if err != nil {
		return sc, err
	}
	per := float64(cfg.count)
	sc.Statements = float64(n1-n0) / per
	sc.ByVerb = map[string]float64{}
	for v, n := range v1 {
		if d := n - v0[v]; d > 0 {
			sc.ByVerb[v] = float64(d) / per
		}
	}
	return sc, nil
}

// pgMeter meters a server on PostgreSQL: its process's CPU and that of
// the backends serving its connections, found by application_name.
func pgMeter(db *sql.DB) startMeter {
	return func(ctx context.Context, in *instance) meter {
		m := &backendMeter{db: db, pid: in.cmd.Process.Pid, app: appName(in.kind.Name + "-" + in.name)}
		m.server, m.serverOK = processCPU(m.pid)
		m.backends = m.backendCPU(ctx)
		return m
	}
}

type backendMeter struct {
	db       *sql.DB
	pid      int
	app      string
	server   time.Duration
	serverOK bool
	backends map[int]time.Duration
}

// backendCPU is the CPU time so far of each backend serving the server.
func (m *backendMeter) backendCPU(ctx context.Context) map[int]time.Duration {
	cpu := map[int]time.Duration{}
	rows, err := m.db.QueryContext(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", m.app)
	if err != nil {
		return cpu
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			if d, ok := processCPU(pid); ok {
				cpu[pid] = d
			}
		}
	}
	return cpu
}

func (m *backendMeter) cpuPerRequest(ctx context.Context, requests int64) (server, backends float64) {
	if requests <= 0 {
		return 0, 0
	}
	if s, ok := processCPU(m.pid); ok && m.serverOK {
		server = micros(s-m.server) / float64(requests)
	}
	var total time.Duration
	for pid, d := range m.backendCPU(ctx) {
		total += d - m.backends[pid] // a backend that started during the run: all of its time
	}
	return server, micros(total) / float64(requests)
}

func (m *backendMeter) commandTime(context.Context, int64) (float64, float64) { return 0, 0 }

// A tableSize is a server's table after a number of first executions,
// each with the trivial handler's answer.
type tableSize struct {
	Server   string  `json:"server"`
	Rows     int64   `json:"rows"`
	Heap     int64   `json:"heap_bytes"`
	Indexes  int64   `json:"index_bytes"`
	Total    int64   `json:"total_bytes"`
	PerRow   float64 `json:"total_bytes_per_row"`
	RowBytes float64 `json:"row_bytes"` // pg_column_size of the row, mean
	Dead     int64   `json:"dead_rows_reported"`
	// After VACUUM FULL.
	Compacted       int64   `json:"total_bytes_vacuum_full"`
	CompactedPerRow float64 `json:"total_bytes_per_row_vacuum_full"`
}

// sizeTable empties k's table, sends it rows first executions, 16 at a
// time, and reads the table's size.
func sizeTable(ctx context.Context, cfg config, db *sql.DB, k kind, in *instance) (tableSize, error) {
	size := tableSize{Server: k.Name}
	table := pg.tables[k.Name]
	if err := truncate(ctx, db, k); err != nil {
		return size, err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	next := make(chan int)
	for range cfg.conns {
		wg.Go(func() {
			for i := range next {
				resp, _, err := post(in.url(), fmt.Sprintf("size-%d", i))
				if err == nil && resp.StatusCode != http.StatusCreated {
					err = fmt.Errorf("%s: a first execution answered %d", k.Name, resp.StatusCode)
				}
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			}
		})
	}
	for i := range cfg.sizingRows {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if failed != nil {
		return size, failed
	}
	time.Sleep(time.Second) // the statistics collector's report of dead rows
	err := db.QueryRowContext(ctx, "SELECT count(*), pg_relation_size('"+table+"'), pg_indexes_size('"+table+"'), "+
		"pg_total_relation_size('"+table+"'), coalesce(avg(pg_column_size(t.*)), 0), "+
		"coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = '"+table+"'::regclass), 0) FROM "+table+" t").
		Scan(&size.Rows, &size.Heap, &size.Indexes, &size.Total, &size.RowBytes, &size.Dead)
	if err != nil {
		return size, err
	}
	if size.Rows > 0 {
		size.PerRow = float64(size.Total) / float64(size.Rows)
	}
	// Compacted: what the rows need once every dead version is gone.
	if _, err := db.ExecContext(ctx, "VACUUM FULL "+table); err != nil {
		return size, err
	}
	if err := db.QueryRowContext(ctx, "SELECT pg_total_relation_size('"+table+"')").Scan(&size.Compacted); err != nil {
		return size, err
	}
	if size.Rows > 0 {
		size.CompactedPerRow = float64(size.Compacted) / float64(size.Rows)
	}
	return size, nil
}

// A purgeCost is the time a purge of 1,000 expired rows took in this
// library's table of Rows rows, median of three.
type purgeCost struct {
	Statement string    `json:"statement"`
	Rows      int64     `json:"rows"`
	Deleted   int64     `json:"deleted"`
	Millis    float64   `json:"ms"`
	Each      []float64 `json:"ms_each"`
	Plan      string    `json:"plan"`
}

// pgNow is the PostgreSQL store's clock, as sqlstatements.go reads it,
// and pgPurgeNow the purge's, read once per statement.
const (
	pgNow      = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)"
	pgPurgeNow = "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000 AS BIGINT)"
)

// purges times this library's purge statement (sqlstatements.go,
// statementsFor, PostgreSQL) on its table as the sizing left it (rows
// rows), then grown to ten times as many by copies of one, each time after
// 1,000 rows were made expired; and, beside it, the same delete with
// the clock read once, as a bound value, which the index on record_until
// can serve.
func purges(ctx context.Context, db *sql.DB, rows int) ([]purgeCost, error) {
	table := pg.tables["ours"]
	expired := "record_until <= " + pgPurgeNow + " AND holder_until <= " + pgPurgeNow
	shipped := "DELETE FROM " + table + " WHERE id IN (SELECT id FROM " + table + " WHERE " + expired +
		" LIMIT 1000 FOR UPDATE SKIP LOCKED) AND " + expired
	once := "DELETE FROM " + table + " WHERE id IN (SELECT id FROM " + table + " WHERE record_until <= $1" +
		" AND holder_until <= $1 LIMIT 1000)"
	var record []byte
	var until int64
	if err := db.QueryRowContext(ctx, "SELECT record, record_until FROM "+table+" LIMIT 1").Scan(&record, &until); err != nil {
		return nil, err
	}
	var costs []purgeCost
	for _, grown := range []bool{false, true} {
		if grown {
			// Up to ten times the rows the sizing wrote, each a copy of
			// one of its rows under a new id.
			if _, err := db.ExecContext(ctx, "INSERT INTO "+table+" (id, record, record_until) "+
				"SELECT 'copy-' || g, $2::bytea, $3::bigint FROM "+
				"generate_series(1, $1::int - (SELECT count(*) FROM "+table+")::int) g", 10*rows, record, until); err != nil {
				return nil, err
			}
		}
		if _, err := db.ExecContext(ctx, "VACUUM ANALYZE "+table); err != nil {
			return nil, err
		}
		for _, stmt := range []string{shipped, once} {
			c := purgeCost{Statement: stmt}
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&c.Rows); err != nil {
				return nil, err
			}
			for range 3 {
				if _, err := db.ExecContext(ctx, "UPDATE "+table+" SET record_until = 0 WHERE id IN "+
					"(SELECT id FROM "+table+" WHERE record_until > 0 LIMIT 1000)"); err != nil {
					return nil, err
				}
				var args []any
				if stmt == once {
					var now int64
					if err := db.QueryRowContext(ctx, "SELECT "+pgNow).Scan(&now); err != nil {
						return nil, err
					}
					args = append(args, now)
				}
				if c.Plan == "" {
					c.Plan = plan(ctx, db, stmt, args)
				}
				t0 := time.Now()
				res, err := db.ExecContext(ctx, stmt, args...)
				if err != nil {
					return nil, err
				}
				ms := float64(time.Since(t0).Microseconds()) / 1000
				c.Each = append(c.Each, ms)
				n, _ := res.RowsAffected()
				c.Deleted += n
			}
			c.Deleted /= 3
			c.Millis = medianOf(c.Each)
			costs = append(costs, c)
			log.Printf("  %d rows, %s: %.1f ms for %d rows (%s)", c.Rows, map[bool]string{true: "shipped", false: "clock once"}[stmt == shipped],
				c.Millis, c.Deleted, c.Plan)
		}
	}
	return costs, nil
}

// plan is how PostgreSQL finds the expired rows for stmt: the scan nodes
// of its plan.
func plan(ctx context.Context, db *sql.DB, stmt string, args []any) string {
	rows, err := db.QueryContext(ctx, "EXPLAIN "+stmt, args...)
	if err != nil {
		return "?"
	}
	defer rows.Close()
	var scans []string
	for rows.Next() {
		var line string
		if rows.Scan(&line) == nil && strings.Contains(line, "Scan") {
			line = strings.TrimLeft(strings.TrimSpace(line), "-> ")
			line, _, _ = strings.Cut(line, "  (")
			line = strings.ReplaceAll(line, pg.tables["ours"], "keys")
			scans = append(scans, line)
		}
	}
	return strings.Join(scans, "; ")
}
