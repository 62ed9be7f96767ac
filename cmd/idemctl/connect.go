package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/admin"
	"github.com/onceonly/idempotency/internal/sqltest/dburl"
	"github.com/onceonly/idempotency/sqldialect"
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/redis/go-redis/v9"
)

// A session is what a command works with: the middleware's view of its
// store (Redis, or with -store its SQL table) and, with -db, the outcome
// store.
type session struct {
	rdb      redis.UniversalClient // nil with -store
	keys     *sql.DB               // -store's database; nil without
	dialect  sqldialect.Dialect    // -store's
	ops      *admin.Operator
	outcomes *sqlidem.Store // nil without -db
	timeout  time.Duration
	closers  []func() error
	clocks   map[string]time.Duration // the store's clock minus ours, by server (clock.go)
}

func connect(ctx context.Context, o options, stderr io.Writer) (*session, error) {
	s := &session{timeout: o.timeout, clocks: map[string]time.Duration{}}
	// The middleware's own warnings (an evicting Redis) concern the
	// operator too.
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := []idempotency.Option{idempotency.WithKeyPrefix(o.prefix), idempotency.WithLogger(logger)}
	if o.replayHeaders != nil {
		// Resolve stores the headers this Middleware would: the service's
		// allowlist, when it has one.
		opts = append(opts, idempotency.WithReplayHeaders(o.replayHeaders...))
	}
	if o.store != "" {
		if err := s.openStore(ctx, o, opts); err != nil {
			s.close()
			return nil, err
		}
	} else {
		rdb, err := openRedis(o)
		if err != nil {
			return nil, err
		}
		s.rdb = rdb
		s.closers = append(s.closers, rdb.Close)
		s.ops = admin.New(idempotency.New(rdb, opts...))
	}
	if o.dsn == "" {
		return s, nil
	}
	d, err := databaseOf(o.dsn, o.driver)
	if err == nil {
		err = sqliteFileExists(d, "-db")
	}
	if err != nil {
		s.close()
		return nil, err
	}
	db, err := sql.Open(d.Driver, d.DSN)
	if err != nil {
		s.close()
		return nil, usagef("-db: %v", err)
	}
	db.SetMaxOpenConns(4) // one command at a time; NewSQL warns of a pool without a limit
	s.closers = append(s.closers, db.Close)
	if s.outcomes, err = sqlidem.New(db, d.Dialect, sqlidem.WithTable(o.table)); err != nil {
		s.close()
		return nil, usagef("%v", err)
	}
	step, cancel := s.step(ctx)
	defer cancel()
	if err := db.PingContext(step); err != nil {
		s.close()
		return nil, fmt.Errorf("database: %w", err)
	}
	return s, nil
}

// openStore opens -store, the database of a middleware made by NewSQL,
// and its operator. It creates nothing: a table that is not there is an
// error of the first command that reads it.
func (s *session) openStore(ctx context.Context, o options, opts []idempotency.Option) error {
	d, err := dburl.Parse(o.store)
	switch {
	case errors.Is(err, dburl.ErrUnknownScheme):
		return usagef("-store: name the database by its URL: postgres://…, mysql://…, sqlite:PATH or file:PATH")
	case err != nil:
		return usagef("-store: %v", err)
	case !sqldialect.ValidName(o.storeTable, d.Dialect != sqldialect.SQLite):
		return usagef("-store-table %q: not a table name", o.storeTable)
	}
	if err := checked(d, "-store"); err != nil {
		return err
	}
	if err := sqliteFileExists(d, "-store"); err != nil {
		return err
	}
	if d.Driver == dburl.SQLite && !strings.Contains(d.DSN, "busy_timeout") {
		// The service writes the same file: wait for its transactions
		// rather than fail with SQLITE_BUSY.
		sep := "?"
		if strings.Contains(d.DSN, "?") {
			sep = "&"
		}
		d.DSN += sep + "_pragma=busy_timeout(10000)"
	}
	db, err := sql.Open(d.Driver, d.DSN)
	if err != nil {
		return usagef("-store: %v", err)
	}
	db.SetMaxOpenConns(4) // one command at a time; NewSQL warns of a pool without a limit
	s.closers = append(s.closers, db.Close)
	step, cancel := s.step(ctx)
	defer cancel()
	if err := db.PingContext(step); err != nil {
		return fmt.Errorf("-store database: %w", err)
	}
	s.keys, s.dialect = db, d.Dialect
	s.ops = admin.New(idempotency.NewSQL(db, d.Dialect, append(opts, idempotency.WithSQLTable(o.storeTable))...))
	return nil
}

// store names where the middleware keeps its keys, for people.
func (s *session) store() string {
	if s.keys != nil {
		return "the keys table"
	}
	return "Redis"
}

// clockName names the clock a claim's fence was read on, for people.
func (s *session) clockName() string {
	if s.keys != nil {
		return "the database's clock"
	}
	return "Redis TIME"
}

func openRedis(o options) (redis.UniversalClient, error) {
	if o.cluster != "" {
		opts := &redis.ClusterOptions{Addrs: strings.Split(o.cluster, ",")}
		if strings.Contains(o.cluster, "://") {
			var err error
			if opts, err = redis.ParseClusterURL(o.cluster); err != nil {
				return nil, usagef("-cluster: %v", unquoted(err))
			}
		}
		opts.ContextTimeoutEnabled = true
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(o.redisURL)
	if err != nil {
		return nil, usagef("-redis: %v", unquoted(err))
	}
	// Step deadlines bound the sockets too.
	opts.ContextTimeoutEnabled = true
	return redis.NewClient(opts), nil
}

// unquoted replaces url.Parse's errors, which quote the URL or a part of
// it (`invalid port ":pa" after host` for a password with a raw /): it may
// hold a password.
func unquoted(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return errors.New("the URL does not parse (is a /, ? or # of the password not percent-encoded?)")
	}
	return err
}

// step bounds one round of work against Redis or SQL.
func (s *session) step(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

func (s *session) close() {
	for _, c := range s.closers {
		c()
	}
}
