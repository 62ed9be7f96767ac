// Package pgnotify wakes the waiting duplicates of a middleware that keeps
// its keys in PostgreSQL (idempotency.NewSQL) with LISTEN/NOTIFY, over
// pgx: a duplicate that waits for a key's answer is told when the key's
// holder lets go, on any instance, instead of polling for it.
//
//	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL")) // github.com/jackc/pgx/v5/stdlib
//	m := idempotency.NewSQL(db, idempotency.PostgreSQL,
//		idempotency.WithSQLListener(pgnotify.Listener(db)))
//
// A Middleware listens on one connection of its own while any of its
// requests waits, and for a while after: dialled with the configuration of
// db's connections, outside db's pool, so that listening never takes a
// connection the pool's SetMaxOpenConns counts. Holders notify only keys
// that someone waits for. A notification missed (the connection dropped,
// the database restarted) costs a waiter its next poll, never an answer.
package pgnotify

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/onceonly/idempotency"
)

// Listener returns an idempotency.SQLListener that listens on a
// connection like db's, which must be opened with pgx's database/sql driver
// (github.com/jackc/pgx/v5/stdlib: sql.Open("pgx", …), stdlib.OpenDB or
// stdlib.OpenDBFromPool). On another driver the middleware logs, once,
// that it cannot listen, and its waiters poll.
func Listener(db *sql.DB) idempotency.SQLListener { return listener{db: db} }

type listener struct{ db *sql.DB }

// ErrNotPgx: the database was not opened with pgx's driver.
var ErrNotPgx = errors.New("pgnotify: the database's driver is not pgx's (github.com/jackc/pgx/v5/stdlib)")

// Listen listens on channel until ctx ends, connecting again after a
// pause (up to 5 s) whenever the connection fails.
func (l listener) Listen(ctx context.Context, channel string, listening func(), deliver func(payload string)) error {
	pause := 50 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := l.listenOnce(ctx, channel, listening, deliver)
		if errors.Is(err, ErrNotPgx) {
			return err
		}
		if time.Since(start) > time.Minute {
			pause = 50 * time.Millisecond // it listened a while: a new failure
		}
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		timer.Stop()
		pause = min(2*pause, 5*time.Second)
	}
	return nil
}

// listenOnce dials a connection with the configuration of db's, listens
// on it until it fails or ctx ends, and closes it.
func (l listener) listenOnce(ctx context.Context, channel string, listening func(), deliver func(string)) error {
	cfg, err := l.config(ctx)
	if err != nil {
		return err
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c.Close(ctx)
	}()
	return listen(ctx, c, channel, listening, deliver)
}

// config is the configuration of db's connections, read from one of them.
func (l listener) config(ctx context.Context) (*pgx.ConnConfig, error) {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var cfg *pgx.ConnConfig
	err = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w (a %T)", ErrNotPgx, dc)
		}
		cfg = sc.Conn().Config()
		// The copy keeps the pooled connection's handler, which would take
		// this connection's notifications: pgx installs its own when none.
		cfg.OnNotification = nil
		return nil
	})
	return cfg, err
}

func listen(ctx context.Context, c *pgx.Conn, channel string, listening func(), deliver func(string)) error {
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	listening()
	for {
		n, err := c.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Channel == channel {
			deliver(n.Payload)
		}
	}
}
