// Package pgnotify wakes the waiting duplicates of a middleware that keeps
// its keys in PostgreSQL (idempotency.NewSQL) with LISTEN/NOTIFY, over
// pgx: a duplicate that waits for a key's answer is told when the key's
// holder lets go, on any instance, instead of polling for it.
//
//	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL")) // github.com/jackc/pgx/v5/stdlib
//	m := idempotency.NewSQL(db, idempotency.PostgreSQL,
//		idempotency.WithSQLListener(pgnotify.Listener(db)))
//
// A Middleware listens on one connection of db, taken from the pool while
// any of its requests waits and for a while after (the pool's
// SetMaxOpenConns counts it). Holders notify only keys that someone waits
// for. A notification missed (the connection dropped, the database
// restarted) costs a waiter its next poll, never an answer.
package pgnotify

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/onceonly/idempotency"
)

// Listener returns an idempotency.SQLListener that listens on a
// connection of db, which must be opened with pgx's database/sql driver
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

// listenOnce takes a connection from the pool, listens on it until it
// fails or ctx ends, and then closes it: a connection that listened never
// goes back to the pool, where its notifications would pile up.
func (l listener) listenOnce(ctx context.Context, channel string, listening func(), deliver func(string)) error {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w (a %T)", ErrNotPgx, dc)
		}
		err := listen(ctx, sc.Conn(), channel, listening, deliver)
		// driver.ErrBadConn: database/sql closes the connection.
		return errors.Join(err, driver.ErrBadConn)
	})
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
