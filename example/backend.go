package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/bank"
	"github.com/onceonly/idempotency/example/internal/orderlog"
	"github.com/onceonly/idempotency/pgnotify"
	"github.com/redis/go-redis/v9"
)

// A backend is where the example keeps its idempotency keys and tokens and
// the shop's own data (orders, payments, the callbacks' order log): one
// Redis, or, when IDEMPOTENCY_STORE names one, one SQL database and no
// Redis at all.
type backend struct {
	rdb redis.UniversalClient // nil on SQL

	db      *sql.DB // nil on Redis
	dialect idempotency.SQLDialect
	shop    shopStore
}

// onRedis is the backend of rdb.
func onRedis(rdb redis.UniversalClient) backend { return backend{rdb: rdb, shop: redisShop{rdb: rdb}} }

// onSQL is the backend of db, whose shop tables it creates.
func onSQL(ctx context.Context, db *sql.DB, dialect idempotency.SQLDialect) (backend, error) {
	shop, err := newSQLShop(ctx, db, dialect)
	return backend{db: db, dialect: dialect, shop: shop}, err
}

// protection is a middleware that keeps its keys in the backend.
func (b backend) protection(opts ...idempotency.Option) *idempotency.Middleware {
	// A handler in flight when the process is told to stop ends (its
	// answer stored, or cut off and its key kept) before the server's
	// share of the grace runs out; an option of the route's own comes
	// after, and wins.
	opts = append([]idempotency.Option{idempotency.WithExecutionTimeout(executionBound)}, opts...)
	if b.db != nil {
		if b.dialect == idempotency.PostgreSQL {
			// Waiting duplicates are told when the key's holder lets go.
			opts = append(opts, idempotency.WithSQLListener(pgnotify.Listener(b.db)))
		}
		return idempotency.NewSQL(b.db, b.dialect, opts...)
	}
	return idempotency.New(b.rdb, opts...)
}

// orderLog is the order log of the callbacks: named name in Redis, in the
// tables table_* in SQL.
func (b backend) orderLog(ctx context.Context, name, table string) (*orderlog.Log, error) {
	instance := "pid-" + strconv.Itoa(os.Getpid())
	if b.db != nil {
		return orderlog.NewSQL(ctx, b.db, b.dialect, table, instance)
	}
	return orderlog.New(b.rdb, name, instance), nil
}

// storeVar names the database of the keys; unset, they are in Redis.
const storeVar = "IDEMPOTENCY_STORE"

// openBackend opens the backend the environment names: the database of
// IDEMPOTENCY_STORE, else the Redis of connect. A database is reached, and
// the shop's tables created, before it returns: a wrong URL fails at
// start-up, not at the first request.
func openBackend() (backend, func(), error) {
	raw := os.Getenv(storeVar)
	if raw == "" {
		rdb, closeRedis, err := connect()
		if err != nil {
			return backend{}, nil, err
		}
		return onRedis(rdb), closeRedis, nil
	}
	d, err := bank.ParseURL(storeVar, raw)
	if err != nil {
		return backend{}, nil, err
	}
	db, err := sql.Open(d.Driver, d.DSN)
	if err != nil {
		return backend{}, nil, fmt.Errorf("%s: opening the %v database: %w", storeVar, d.Dialect, err)
	}
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16) // database/sql keeps 2 idle: every burst would dial again
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The first connection turns a new SQLite file to WAL (the DSN's
	// pragma) before several race for it.
	err = db.PingContext(ctx)
	var b backend
	if err == nil {
		b, err = onSQL(ctx, db, d.Dialect)
	}
	if err != nil {
		db.Close()
		return backend{}, nil, fmt.Errorf("%s: the %v database does not answer: %w", storeVar, d.Dialect, err)
	}
	for _, v := range []string{"REDIS_URL", "REDIS_CLUSTER_ADDRS"} {
		if os.Getenv(v) != "" {
			slog.Warn("example: " + v + " is ignored: " + storeVar + " is set")
		}
	}
	slog.Info(fmt.Sprintf("example: idempotency keys and tokens in %v (%s); no Redis", d.Dialect, storeVar))
	return b, func() { db.Close() }, nil
}
