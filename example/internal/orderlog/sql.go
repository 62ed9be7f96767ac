package orderlog

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/onceonly/idempotency/example/internal/sqltables"
	"github.com/onceonly/idempotency/optimistic"
	"github.com/onceonly/idempotency/sqldialect"
)

// NewSQL returns the log in db's tables PREFIX_entries, PREFIX_reruns and
// PREFIX_states, written by instance, and creates them when they are
// missing. Events and reruns are named there by the SHA-256 of their names
// (a key is the client's, of any length); an entry names its event in
// full.
func NewSQL(ctx context.Context, db *sql.DB, dialect optimistic.Dialect, prefix, instance string) (*Log, error) {
	if !sqldialect.ValidIdentifier(prefix + "_entries") {
		return nil, fmt.Errorf("orderlog: %q is no table name prefix", prefix)
	}
	s := &sqlStore{db: db, dialect: dialect, entriesTable: prefix + "_entries", rerunsTable: prefix + "_reruns",
		states: optimistic.Table{Dialect: dialect, Name: prefix + "_states", ID: "event"}}
	end := sqltables.TableOptions(dialect)
	err := sqltables.Create(ctx, db, dialect, "orderlog "+prefix,
		"CREATE TABLE IF NOT EXISTS "+s.entriesTable+` (
	event VARCHAR(64) PRIMARY KEY,
	entry TEXT NOT NULL
)`+end,
		"CREATE TABLE IF NOT EXISTS "+s.rerunsTable+` (
	rerun VARCHAR(64) PRIMARY KEY
)`+end,
		"CREATE TABLE IF NOT EXISTS "+s.states.Name+` (
	event      VARCHAR(64) PRIMARY KEY,
	order_id   BIGINT NOT NULL,
	status     TEXT NOT NULL,
	instance   TEXT NOT NULL,
	handled_ns BIGINT NOT NULL,
	fence      BIGINT NOT NULL DEFAULT 0
)`+end)
	if err != nil {
		return nil, fmt.Errorf("orderlog: creating the tables of %s: %w", prefix, err)
	}
	return &Log{store: s, instance: instance}, nil
}

// sqlStore keeps a log in SQL: an entry per event, inserted unless the
// event has one; a row per rerun; each event's state in a row fenced by
// optimistic.Table.FencedUpdate.
type sqlStore struct {
	db                        *sql.DB
	dialect                   optimistic.Dialect
	entriesTable, rerunsTable string
	states                    optimistic.Table
}

func (s *sqlStore) setState(ctx context.Context, event string, e Effect) error {
	return sqltables.FencedPut(ctx, s.db, s.states, digest(event), e.Fence,
		optimistic.Set("order_id", e.Order), optimistic.Set("status", e.Status),
		optimistic.Set("instance", e.Instance), optimistic.Set("handled_ns", e.HandledAt.UnixNano()))
}

func (s *sqlStore) addEntry(ctx context.Context, event string, entry []byte) (bool, error) {
	res, err := s.db.ExecContext(ctx, sqltables.InsertIfAbsent(s.dialect, s.entriesTable, "event", "event", "entry"),
		digest(event), string(entry))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (s *sqlStore) entry(ctx context.Context, event string) ([]byte, error) {
	var entry string
	err := s.db.QueryRowContext(ctx, s.dialect.Bind("SELECT entry FROM "+s.entriesTable+" WHERE event = ?"), digest(event)).Scan(&entry)
	return []byte(entry), err
}

func (s *sqlStore) addRerun(ctx context.Context, member string) error {
	_, err := s.db.ExecContext(ctx, sqltables.InsertIfAbsent(s.dialect, s.rerunsTable, "rerun", "rerun"), digest(member))
	return err
}

func (s *sqlStore) entries(ctx context.Context) (map[string][]byte, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT event, entry FROM "+s.entriesTable)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]byte{}
	for rows.Next() {
		var event, entry string
		if err := rows.Scan(&event, &entry); err != nil {
			return nil, err
		}
		out[event] = []byte(entry)
	}
	return out, rows.Err()
}

func (s *sqlStore) reruns(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+s.rerunsTable).Scan(&n)
	return n, err
}
