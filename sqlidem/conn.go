package sqlidem

import (
	"context"
	"database/sql"
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
		gone := ended(ctx, conn, err)
		conn.Close()
		if !gone || attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// lookupOnConn reads key's row (lookup) on a connection of its own, which
// it returns for the statements after it (nil when err is set).
func (s *Store) lookupOnConn(ctx context.Context, key string) (conn *sql.Conn, row Row, found bool, err error) {
	conn, err = s.connect(ctx, func(conn *sql.Conn) (err error) {
		row, found, err = s.lookup(ctx, conn, key)
		return err
	})
	return conn, row, found, err
}
