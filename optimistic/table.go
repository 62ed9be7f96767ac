package optimistic

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// Querier runs the helpers' statements. *sql.DB, *sql.Conn and *sql.Tx all
// satisfy it; inside a transaction the follow-up read that explains a
// refused write goes through the same transaction.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Table names a table whose rows carry a version column (for Update), a
// fence column (for FencedUpdate), or both. Every name is validated and
// quoted for the Dialect before it reaches SQL, so none can inject SQL;
// values always travel as parameters.
//
// The version and fence columns are integers (BIGINT) and should be NOT
// NULL DEFAULT 0; a NULL counts as 0. Both helpers tell a refused write by
// the rows the UPDATE affected. MySQL and MariaDB count changed rows rather
// than matched ones unless the DSN says clientFoundRows=true, but a write
// here always changes the row it matches (a higher version or fence), so
// the count is right either way.
type Table struct {
	// Dialect is required: SQLite, PostgreSQL or MySQL.
	Dialect Dialect
	// Name is the table, optionally qualified by its schema
	// ("billing.invoices"). Required.
	Name string
	// ID is the column that picks one row; it must be unique (the primary
	// key). Default "id".
	ID string
	// Version is the column Update compares and increments. Default
	// "version".
	Version string
	// Fence is the column FencedUpdate compares and stores. Default "fence".
	Fence string
}

// Assignment is one "column = value" of an update; the value travels as a
// parameter.
type Assignment struct {
	Column string
	Value  any
}

// Set returns the assignment column = value.
func Set(column string, value any) Assignment { return Assignment{Column: column, Value: value} }

// quotedTable is a Table whose names passed validation, quoted, with the
// defaults filled in.
type quotedTable struct {
	dialect                  Dialect
	name, id, version, fence string
	raw                      Table // with defaults filled, for messages
}

func (t Table) quoted() (quotedTable, error) {
	if !t.Dialect.Valid() {
		return quotedTable{}, fmt.Errorf("optimistic: table %q has no valid Dialect (%v)", t.Name, t.Dialect)
	}
	t.ID = orDefault(t.ID, "id")
	t.Version = orDefault(t.Version, "version")
	t.Fence = orDefault(t.Fence, "fence")
	if err := validName(t.Name, true); err != nil {
		return quotedTable{}, err
	}
	for _, c := range []string{t.ID, t.Version, t.Fence} {
		if err := validName(c, false); err != nil {
			return quotedTable{}, err
		}
	}
	q := t.Dialect.Quote
	return quotedTable{dialect: t.Dialect, name: q(t.Name), id: q(t.ID),
		version: q(t.Version), fence: q(t.Fence), raw: t}, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (q quotedTable) resource(id any) string { return fmt.Sprintf("%s id %v", q.raw.Name, id) }

// statement builds one parameterised statement, numbering placeholders for
// dialects that number them.
type statement struct {
	dialect Dialect
	sql     strings.Builder
	args    []any
}

func (s *statement) write(parts ...string) {
	for _, p := range parts {
		s.sql.WriteString(p)
	}
}

// param adds a parameter and returns its placeholder.
func (s *statement) param(v any) string {
	s.args = append(s.args, v)
	return s.dialect.Placeholder(len(s.args))
}

// update builds UPDATE name SET <set…>, <guard> = <guardValue> WHERE id = ?
// AND <cond>. guardValue and cond are SQL written by this package; reserved
// names the columns a caller may not assign (the guard and the id).
func (q quotedTable) update(id any, set []Assignment, reserved []string, guardValue func(*statement) string, cond func(*statement) string) (*statement, error) {
	s := &statement{dialect: q.dialect}
	s.write("UPDATE ", q.name, " SET ")
	seen := make(map[string]bool, len(set))
	for _, a := range set {
		if err := validName(a.Column, false); err != nil {
			return nil, err
		}
		// SQLite and MySQL match column names without regard to case, so
		// "Version" would reach the version column there: compare folded.
		key := strings.ToLower(a.Column)
		for _, r := range reserved {
			if key == strings.ToLower(r) {
				return nil, fmt.Errorf("optimistic: %s: column %q is managed by the helper and cannot be set", q.raw.Name, a.Column)
			}
		}
		if seen[key] {
			return nil, fmt.Errorf("optimistic: %s: column %q is set twice", q.raw.Name, a.Column)
		}
		seen[key] = true
		s.write(q.dialect.Quote(a.Column), " = ", s.param(a.Value), ", ")
	}
	s.write(guardValue(s), " WHERE ", q.id, " = ", s.param(id), " AND ", cond(s))
	return s, nil
}

// current reads one integer column of the row id, reporting whether the row
// exists. A NULL reads as 0, as in the statements' COALESCE. With latest
// set, the read on MySQL is a locking read (FOR UPDATE), which reads the
// latest committed row, as an UPDATE does, rather than the snapshot of a
// REPEATABLE READ transaction (see FencedUpdate). PostgreSQL and SQLite
// need no such read: an UPDATE there refuses a row that changed after the
// snapshot (a serialization failure), and a read after it that found
// nothing to update sees the row as the UPDATE did or newer.
func (q quotedTable) current(ctx context.Context, db Querier, column string, id any, latest bool) (int64, bool, error) {
	s := &statement{dialect: q.dialect}
	s.write("SELECT ", column, " FROM ", q.name, " WHERE ", q.id, " = ", s.param(id))
	if latest && q.dialect == MySQL {
		s.write(" FOR UPDATE")
	}
	var v sql.NullInt64
	err := db.QueryRowContext(ctx, s.sql.String(), s.args...).Scan(&v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	return v.Int64, true, nil
}

// exec runs s and returns how many rows it changed. Every statement here
// changes the guard column of the row it matches (version+1, or a fence
// above the stored one), so MySQL's default "changed rows" count, which
// leaves out rows an UPDATE matched but left as they were, equals the
// matched rows: no clientFoundRows=true is needed in the DSN.
func exec(ctx context.Context, db Querier, s *statement) (int64, error) {
	res, err := db.ExecContext(ctx, s.sql.String(), s.args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
