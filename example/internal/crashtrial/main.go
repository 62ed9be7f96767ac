//go:build unix

// Command crashtrial serves the shop's transfers (POST /transfers, GET
// /accounts) with the same handler and outcome store as the shop, and kills
// itself with SIGKILL at chosen points of a request, for the crash trials
// in this directory, or stops itself with SIGSTOP at one point of a chosen
// request, for the stale-executor trial. It is a test fixture, not a server
// to deploy.
//
// Environment: ADDR, REDIS_URL, DATABASE_URL or DB_PATH, and
//
//	TABLE_PREFIX  the bank's tables (see bank.New); they must exist
//	KEYS          where the middleware keeps its keys: redis (the
//	              default, at REDIS_URL) or sql, the bank's database
//	              (idempotency.NewSQL, table TABLE_PREFIX+"keys"), with
//	              no Redis at all
//	LOCK_LEASE    the middleware's lock lease (default 400ms), short so
//	              that a dead executor's key frees quickly
//	KILL_AT       point=fraction,…: the fraction of requests that die at
//	              each point (before, inside, committed, stored)
//	KILL_LOG      a file that gets one line, the point, before each kill
//	PAUSE_AT      a point (before or inside) where a request carrying the
//	              header Crash-Trial-Pause: 1 stops the whole process with
//	              SIGSTOP, until a SIGCONT
//	SLOW          fraction:duration: that fraction of the transfers waits
//	              that long inside its transaction, after its writes, so
//	              that a Redis outage finds work in flight
package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/bank"
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/redis/go-redis/v9"
)

// The points where a request may die, in the order it reaches them. The
// keys' store is Redis, or with KEYS=sql the keys table.
const (
	// before: claimed in the keys' store, no transaction begun.
	before = "before"
	// inside: the transfer's writes done, its transaction not committed.
	inside = "inside"
	// committed: the answer committed in SQL, not yet stored in the keys'
	// store.
	committed = "committed"
	// stored: the answer stored in the keys' store, not yet sent to the
	// client.
	stored = "stored"
)

// keysTable is the table, after TABLE_PREFIX, that KEYS=sql keeps the
// keys in.
const keysTable = "keys"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "crashtrial:", err)
		os.Exit(1)
	}
}

func run() error {
	kills, err := parseKillAt(os.Getenv("KILL_AT"))
	if err != nil {
		return err
	}
	pauseAt := os.Getenv("PAUSE_AT")
	if pauseAt != "" && pauseAt != before && pauseAt != inside {
		return fmt.Errorf("PAUSE_AT: %q is neither %s nor %s", pauseAt, before, inside)
	}
	lease := 400 * time.Millisecond
	if v := os.Getenv("LOCK_LEASE"); v != "" {
		if lease, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("LOCK_LEASE: %w", err)
		}
	}
	keysIn := os.Getenv("KEYS")
	if keysIn != "" && keysIn != "redis" && keysIn != "sql" {
		return fmt.Errorf("KEYS: %q is neither redis nor sql", keysIn)
	}
	db, dialect, err := bank.Open(os.Getenv("DATABASE_URL"), os.Getenv("DB_PATH"))
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The trial's reading of why a transfer did not commit.
	logRefusal := sqlidem.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
		logger.Warn("crashtrial: a transfer did not commit", "key", r.Header.Get("Idempotency-Key"),
			"error", err, "cause", context.Cause(r.Context()))
		idempotency.DefaultErrorHandler(w, r, err)
	})
	b, err := bank.New(db, dialect, os.Getenv("TABLE_PREFIX"), logRefusal)
	if err != nil {
		return err
	}
	k := &killer{fractions: kills, log: os.Getenv("KILL_LOG"), pauseAt: pauseAt, logger: logger}
	if v := os.Getenv("SLOW"); v != "" {
		fraction, d, _ := strings.Cut(v, ":")
		f, err1 := strconv.ParseFloat(fraction, 64)
		wait, err2 := time.ParseDuration(d)
		if err1 != nil || err2 != nil || f < 0 || f > 1 {
			return fmt.Errorf("SLOW: %q is not fraction:duration", v)
		}
		k.slow, k.slowFor = f, wait
	}
	options := []idempotency.Option{idempotency.WithCallerCredentials(), idempotency.WithOutcomeStore(b.Outcomes()),
		idempotency.WithFingerprint(idempotency.CanonicalJSON),
		idempotency.WithLockLease(lease),
		idempotency.WithLogger(logger)}
	var m *idempotency.Middleware
	if keysIn == "sql" {
		m = idempotency.NewSQL(db, dialect, append(options,
			idempotency.WithSQLTable(os.Getenv("TABLE_PREFIX")+keysTable))...)
	} else {
		opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
		if err != nil {
			return fmt.Errorf("REDIS_URL: %w", err)
		}
		opts.ContextTimeoutEnabled = true
		m = idempotency.New(redis.NewClient(opts), options...)
	}

	// The shop's chain, idempotency.ProtectKey(store.Handler(Transfer)),
	// with a kill point between each two links.
	transfer := k.inside(b.Transfer)
	handler := k.after(stored, m.ProtectKey(k.before(k.after(committed, b.Outcomes().Handler(transfer)))))
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", handler)
	mux.HandleFunc("GET /accounts", b.ListAccounts)
	return http.ListenAndServe(os.Getenv("ADDR"), mux)
}

// parseKillAt reads KILL_AT: point=fraction,…
func parseKillAt(s string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' }) {
		point, v, _ := strings.Cut(part, "=")
		f, err := strconv.ParseFloat(v, 64)
		switch point {
		case before, inside, committed, stored:
		default:
			return nil, fmt.Errorf("KILL_AT: unknown point %q", point)
		}
		if err != nil || f < 0 || f > 1 {
			return nil, fmt.Errorf("KILL_AT: %q is not a fraction", v)
		}
		out[point] = f
	}
	return out, nil
}

// A killer ends the process at a point, for a fraction of the requests
// that reach it, or stops it there for the request that asks.
type killer struct {
	fractions map[string]float64
	log       string
	pauseAt   string
	logger    *slog.Logger
	slow      float64 // the fraction of transfers that wait slowFor inside
	slowFor   time.Duration
}

// pauseHeader asks a server started with PAUSE_AT to stop at that point
// while it serves this request.
const pauseHeader = "Crash-Trial-Pause"

// maybePause stops the whole process with SIGSTOP at point when r asks
// for it. A stopped process keeps its connections, its open transaction
// and its locks, but renews no lease, as in a long GC pause or a frozen
// VM, until it gets SIGCONT. The caller carries on from here then, as a
// paused executor would.
func (k *killer) maybePause(point string, r *http.Request) {
	if k.pauseAt != point || r.Header.Get(pauseHeader) != "1" {
		return
	}
	k.logger.Info("crashtrial: stopping", "point", point, "key", r.Header.Get("Idempotency-Key"))
	stopSelf()
	k.logger.Info("crashtrial: continued", "point", point, "key", r.Header.Get("Idempotency-Key"))
}

// maybeDie kills the process with SIGKILL, as a crash or an OOM kill
// would: no deferred function, no buffered write, no shutdown runs.
func (k *killer) maybeDie(point string) {
	if rand.Float64() >= k.fractions[point] {
		return
	}
	if k.log != "" {
		// One write(2) of one line: O_APPEND keeps the lines of several
		// processes whole.
		if f, err := os.OpenFile(k.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
			f.WriteString(point + "\n")
			f.Close()
		}
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way; nothing else may run
}

// before stands between the middleware and the store: the key is claimed,
// no transaction begun.
func (k *killer) before(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k.maybeDie(before)
		k.maybePause(before, r)
		next.ServeHTTP(w, r)
	})
}

// inside wraps the transfer: its writes are done, the commit not.
func (k *killer) inside(fn func(*sql.Tx, http.ResponseWriter, *http.Request) error) func(*sql.Tx, http.ResponseWriter, *http.Request) error {
	return func(tx *sql.Tx, w http.ResponseWriter, r *http.Request) error {
		err := fn(tx, w, r)
		if err == nil {
			if rand.Float64() < k.slow {
				select {
				case <-time.After(k.slowFor):
				case <-r.Context().Done(): // cut off: the lease was lost
					return context.Cause(r.Context())
				}
			}
			k.maybeDie(inside)
			k.maybePause(inside, r)
		}
		return err
	}
}

// after dies at point once next has answered 201: inside the middleware,
// after the commit and before the store in the keys' store; outside it,
// after the store and before the answer leaves the process.
func (k *killer) after(point string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if sw.status == http.StatusCreated {
			k.maybeDie(point)
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
