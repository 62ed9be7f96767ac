// Command example runs a small shop whose order and payment endpoints are
// protected by the idempotency middleware.
//
//	go run ./example
//
// With no REDIS_URL it runs on an embedded in-process Redis; REDIS_URL
// (redis://host:port/0) selects a real one and REDIS_CLUSTER_ADDRS
// (host:port,host:port,…) a Redis Cluster. ADDR (default :8080) is where it
// listens, ORDER_LATENCY (default 0) and PAYMENT_LATENCY (default 300ms) how
// slow its back ends are. IDEMPOTENCY_TOKEN_KEYS (sign=<base64> …, see
// idempotency.ParseTokenKeys) is the key ring of the order forms' tokens,
// which instances that share a Redis must share; without it each process
// draws a random key. Payments charge a fake payment provider that runs
// in the process, or the one at PROVIDER_URL (example/internal/provider
// serves one): a payment whose instance dies mid-way is resumed by the
// retry, and the provider charges once.
//
// Account balances (POST /transfers, GET /accounts) live in SQL: an
// embedded SQLite in a temporary file by default, the SQLite file that -db
// or DB_PATH names, or the PostgreSQL or MySQL/MariaDB database of
// DATABASE_URL (postgres://user:password@host:5432/dbname or
// mysql://user:password@tcp(host:3306)/dbname). Instances that share a
// Redis must share the database too, to be one shop.
//
// IDEMPOTENCY_STORE keeps everything that is in Redis otherwise in one SQL
// database instead, and starts and uses no Redis (REDIS_URL and
// REDIS_CLUSTER_ADDRS are ignored): the middlewares' keys and the order
// forms' spent tokens (idempotency.NewSQL), the orders, the payments and
// the callbacks' order log, and the accounts too unless DATABASE_URL or
// DB_PATH names their database. It is a URL as DATABASE_URL is, or a
// SQLite file:
//
//	IDEMPOTENCY_STORE=postgres://user:password@host:5432/dbname?sslmode=disable go run ./example
//	IDEMPOTENCY_STORE=mysql://user:password@tcp(host:3306)/dbname go run ./example
//	IDEMPOTENCY_STORE=sqlite:/var/lib/shop/keys.db go run ./example
//
// The tables are created on first use. A SQLite file serves one process;
// instances that share a PostgreSQL or MySQL database are one shop, and
// share IDEMPOTENCY_TOKEN_KEYS. A URL that does not parse, or a database
// that does not answer at start-up, stops the example with an error. A
// duplicate that waits for the first request polls the database rather
// than being told, so it learns of the answer up to half a second later.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/bank"
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(); err != nil {
		slog.Error("example: " + err.Error())
		os.Exit(1)
	}
}

func run() error {
	dbPath := flag.String("db", os.Getenv("DB_PATH"), "the SQLite `file` of the accounts (default DB_PATH, else a temporary file)")
	flag.Parse()
	cfg, err := configFromEnv()
	if err != nil {
		return err
	}
	back, closeBackend, err := openBackend()
	if err != nil {
		return err
	}
	defer closeBackend()
	accounts, closeDB, err := openBank(*dbPath, back)
	if err != nil {
		return err
	}
	defer closeDB()

	handler, protections, err := newApp(back, cfg, accounts)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler: handler,
		// A client that sends its headers or body slowly (or never stops
		// sending) must not hold a connection and a goroutine for ever;
		// the middleware reads a protected request's whole body before the
		// handler runs.
		ReadHeaderTimeout: 2 * time.Second,
		ReadTimeout:       3 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	slog.Info("example: shop listening on " + browsable(ln.Addr()))

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// In-flight requests finish and protected handlers store their answers
	// before the process exits: a retry on another instance then replays
	// them instead of finding them interrupted. All of it within grace,
	// under Kubernetes' default termination grace period (30 s), after
	// which the process is killed.
	slog.Info("example: shutting down; waiting for requests in flight")
	deadline := time.Now().Add(grace)
	shutdown, cancel := context.WithDeadline(context.Background(), deadline.Add(-drainShare))
	defer cancel()
	stopped := srv.Shutdown(shutdown)
	// Then the stores and releases that the store did not take at once (a
	// blip during the last requests) are done before the process exits,
	// also when requests were still running: the middleware waits for
	// those too, and names the keys it could not finish.
	drain, cancelDrain := context.WithDeadline(context.Background(), deadline)
	defer cancelDrain()
	drained := protections.Shutdown(drain)
	if stopped != nil || drained != nil {
		return fmt.Errorf("shutdown: %w", errors.Join(stopped, drained))
	}
	slog.Info("example: stopped")
	return nil
}

// grace bounds a shutdown, within Kubernetes' default 30 s; drainShare of
// it is kept for the middleware's drain after the server's; executionBound
// is the longest a protected handler runs (WithExecutionTimeout), short of
// the server's share.
const (
	grace          = 28 * time.Second
	drainShare     = 3 * time.Second
	executionBound = 20 * time.Second
)

// browsable is a clickable address for a listener: localhost for a
// wildcard address.
func browsable(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}

type config struct {
	addr            string
	orderLatency    time.Duration
	paymentLatency  time.Duration
	callbackLatency time.Duration
	// providerURL is the payment provider's base URL (PROVIDER_URL); ""
	// runs one in this process, PAYMENT_LATENCY slow.
	providerURL string
	// tokenKeys sign and check the order forms' tokens
	// (IDEMPOTENCY_TOKEN_KEYS); nil: a random key of this process.
	tokenKeys []idempotency.Option
}

func configFromEnv() (config, error) {
	cfg := config{addr: ":8080", paymentLatency: 300 * time.Millisecond, callbackLatency: 10 * time.Millisecond,
		providerURL: os.Getenv("PROVIDER_URL")}
	if v := os.Getenv("ADDR"); v != "" {
		cfg.addr = v
	}
	if v := os.Getenv("IDEMPOTENCY_TOKEN_KEYS"); v != "" {
		ring, err := idempotency.ParseTokenKeys(v)
		if err != nil {
			return cfg, fmt.Errorf("IDEMPOTENCY_TOKEN_KEYS: %w", err)
		}
		cfg.tokenKeys = []idempotency.Option{idempotency.WithTokenKeys(ring)}
	}
	for name, dst := range map[string]*time.Duration{
		"ORDER_LATENCY": &cfg.orderLatency, "PAYMENT_LATENCY": &cfg.paymentLatency,
		"CALLBACK_LATENCY": &cfg.callbackLatency,
	} {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return cfg, fmt.Errorf("%s=%q is not a duration such as 250ms", name, v)
			}
			*dst = d
		}
	}
	return cfg, nil
}

// connect picks the Redis named by the environment, or starts an embedded
// one so that the example needs no set-up.
func connect() (redis.UniversalClient, func(), error) {
	if addrs := os.Getenv("REDIS_CLUSTER_ADDRS"); addrs != "" {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: strings.Split(addrs, ","), ContextTimeoutEnabled: true,
		})
		slog.Info("example: using Redis Cluster", "addrs", addrs)
		return rdb, func() { rdb.Close() }, ping(rdb)
	}
	if url := os.Getenv("REDIS_URL"); url != "" {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		// Let the middleware's store timeout cut a stalled Redis short.
		opts.ContextTimeoutEnabled = true
		rdb := redis.NewClient(opts)
		slog.Info("example: using Redis", "addr", opts.Addr)
		return rdb, func() { rdb.Close() }, ping(rdb)
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, nil, err
	}
	slog.Warn("example: REDIS_URL is not set; using an embedded in-process Redis (miniredis). " +
		"Its data is lost on exit and it cannot be shared by several instances.")
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	return rdb, func() { rdb.Close(); mr.Close() }, nil
}

// openBank opens the accounts' database (see the package comment), creates
// its tables if they are missing, and opens the demo accounts. With
// neither DATABASE_URL nor a SQLite file named, the accounts live in the
// database of back's keys when it has one.
func openBank(sqlitePath string, back backend) (*bank.Bank, func(), error) {
	url, cleanup := os.Getenv("DATABASE_URL"), func() {}
	var db *sql.DB
	var dialect sqlidem.Dialect
	switch {
	case url != "":
		slog.Info("example: accounts in the database of DATABASE_URL")
	case sqlitePath != "":
		slog.Info("example: accounts in SQLite", "file", sqlitePath)
	case back.db != nil:
		db, dialect = back.db, back.dialect
		slog.Info("example: accounts in the database of " + storeVar)
	default:
		dir, err := os.MkdirTemp("", "shop-")
		if err != nil {
			return nil, nil, err
		}
		sqlitePath, cleanup = dir+"/accounts.db", func() { os.RemoveAll(dir) }
		slog.Warn("example: DATABASE_URL and DB_PATH are not set; accounts in an embedded SQLite in a temporary file, " +
			"deleted on exit: " + sqlitePath)
	}
	closeDB := func() {} // back's database is closed with back
	if db == nil {
		var err error
		if db, dialect, err = bank.Open(url, sqlitePath); err != nil {
			cleanup()
			return nil, nil, err
		}
		closeDB = func() { db.Close(); cleanup() }
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := bank.New(db, dialect, "shop_")
	if err == nil {
		err = b.Setup(ctx, bank.DemoAccounts)
	}
	if err != nil {
		closeDB()
		return nil, nil, fmt.Errorf("%v database: %w", dialect, err)
	}
	return b, closeDB, nil
}

func ping(rdb redis.UniversalClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}
