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
	"github.com/onceonly/idempotency/sqlidem"
	"github.com/redis/go-redis/v9"
)

// A session is what a command works with: the middleware's view of Redis
// and, with -db, the outcome store.
type session struct {
	rdb      redis.UniversalClient
	ops      *admin.Operator
	outcomes *sqlidem.Store // nil without -db
	timeout  time.Duration
	closers  []func() error
	clocks   map[string]time.Duration // Redis TIME minus ours, by node (clock.go)
}

func connect(ctx context.Context, o options, stderr io.Writer) (*session, error) {
	s := &session{timeout: o.timeout, clocks: map[string]time.Duration{}}
	rdb, err := openRedis(o)
	if err != nil {
		return nil, err
	}
	s.rdb = rdb
	s.closers = append(s.closers, rdb.Close)
	// The middleware's own warnings (an evicting Redis) concern the
	// operator too.
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := []idempotency.Option{idempotency.WithKeyPrefix(o.prefix), idempotency.WithLogger(logger)}
	if o.replayHeaders != nil {
		// Resolve stores the headers this Middleware would: the service's
		// allowlist, when it has one.
		opts = append(opts, idempotency.WithReplayHeaders(o.replayHeaders...))
	}
	s.ops = admin.New(idempotency.New(rdb, opts...))
	if o.dsn == "" {
		return s, nil
	}
	d, err := databaseOf(o.dsn, o.driver)
	if err != nil {
		s.close()
		return nil, err
	}
	db, err := sql.Open(d.Driver, d.DSN)
	if err != nil {
		s.close()
		return nil, usagef("-db: %v", err)
	}
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
