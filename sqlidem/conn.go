package sqlidem

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"time"
)

// connect takes a connection of db's pool for an execution and runs first
// on it: the execution's statements all run on that one connection, so
// that a work that fails can ask whether the database ended it under the
// work (ended). Like database/sql with its pool's connections, it moves
// past one the server ended while it sat idle (a backend terminated, a
// server restarted), for up to 3 connections.
func (s *Store) connect(ctx context.Context, first func(*sql.Conn) error) (*sql.Conn, error) {
	for attempt := 1; ; attempt++ {
		conn, err := s.db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		err = first(conn)
		if err == nil {
			return conn, nil
		}
		gone := ended(ctx, conn)
		conn.Close()
		if !gone || attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// ended reports whether conn can no longer run a statement: the server
// terminated it, a restart or the network cut it, or a statement was cut
// mid-way. Whatever a work's error then says ("invalid connection",
// SQLSTATE 57P01, an EOF), its transaction committed nothing. A driver
// that can tell without the network says so (driver.Validator:
// go-sql-driver/mysql); any other (pgx) is asked with a ping, bounded by
// endedPing, which only a work that failed pays for.
func ended(ctx context.Context, conn *sql.Conn) bool {
	validated := false
	err := conn.Raw(func(dc any) error {
		v, ok := dc.(driver.Validator)
		if ok && !v.IsValid() {
			return driver.ErrBadConn
		}
		validated = ok
		return nil
	})
	if err != nil || validated {
		return err != nil
	}
	ctx, cancel := context.WithTimeout(ctx, endedPing)
	defer cancel()
	return conn.PingContext(ctx) != nil
}

// endedPing bounds ended's ping: a database that cannot answer it within
// this has failed the work as surely as one that ended its connection.
const endedPing = time.Second
