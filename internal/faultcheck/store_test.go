package faultcheck_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/admin"
	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/sqltest"
	"github.com/onceonly/idempotency/sqldialect"
)

// keyStore is where the instances keep their keys, as the rig reaches it:
// a Redis (TestFaultCheck) or an SQL database (TestFaultCheckSQL). The
// checker's rules are the same for both; what differs is how an instance
// connects, how the checker reads a history's keys, and the faults of the
// server itself.
type keyStore interface {
	// server is the address the instances' fault proxies forward to; ""
	// when the store has no connection to fault (SQLite, a file).
	server() string
	// connect fills in how an instance reaches the store: through addr,
	// its proxy's address, when the store has a server.
	connect(spec *instanceSpec, addr string)
	// operator reads the keys of a history's prefix.
	operator(prefix string) *admin.Operator
	// locked reports whether some key of the prefix holds its lease.
	locked(ctx context.Context, prefix string) (bool, error)
	// records lists the names of the prefix's records.
	records(ctx context.Context, prefix string) ([]string, error)
	// record is the text of the record name ("" for none, or one past its
	// life).
	record(ctx context.Context, name string) (string, error)
}

// redisKeys is the rig's Redis. It reads the rig's fields each time: a
// Redis restart replaces them.
type redisKeys struct{ r *rig }

func (s redisKeys) server() string { return s.r.store.Addr() }

func (s redisKeys) connect(spec *instanceSpec, addr string) { spec.Store = addr }

func (s redisKeys) operator(prefix string) *admin.Operator {
	return admin.New(idempotency.New(s.r.storeDB, idempotency.WithKeyPrefix(prefix),
		idempotency.WithLogger(slog.New(slog.DiscardHandler))))
}

func (s redisKeys) locked(ctx context.Context, prefix string) (bool, error) {
	names, err := scanAll(ctx, s.r.storeDB, prefix+":*:l")
	return len(names) > 0, err
}

func (s redisKeys) records(ctx context.Context, prefix string) ([]string, error) {
	return scanAll(ctx, s.r.storeDB, prefix+":*:r")
}

func (s redisKeys) record(ctx context.Context, name string) (string, error) {
	text, err := s.r.storeDB.Get(ctx, name).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return text, err
}

// scanAll lists the keys that match pattern.
func scanAll(ctx context.Context, db *redis.Client, pattern string) ([]string, error) {
	var names []string
	it := db.Scan(ctx, 0, pattern, 1000).Iterator()
	for it.Next(ctx) {
		names = append(names, it.Val())
	}
	return names, it.Err()
}

// sqlKeys is an SQL database, every key of the run in one table of its
// own. The checker reads it directly, never through a proxy.
type sqlKeys struct {
	db           *sqltest.DB
	table, probe string // the keys table, and watchDatabase's
}

func (s sqlKeys) server() string { return s.db.Server() }

func (s sqlKeys) connect(spec *instanceSpec, addr string) {
	spec.Kind, spec.Driver, spec.Dialect, spec.Table = string(s.db.Kind), s.db.Driver, s.db.Dialect, s.table
	spec.Store = s.db.DSN
	if addr != "" {
		spec.Store = s.db.Through(addr)
	}
}

func (s sqlKeys) operator(prefix string) *admin.Operator {
	return admin.New(s.operatorMiddleware(prefix))
}

// operatorMiddleware is a Middleware of the checker's own on the keys
// table, which serves no request.
func (s sqlKeys) operatorMiddleware(prefix string) *idempotency.Middleware {
	opts := []idempotency.Option{idempotency.WithSQLTable(s.table), idempotency.WithLogger(slog.New(slog.DiscardHandler))}
	if prefix != "" {
		opts = append(opts, idempotency.WithKeyPrefix(prefix))
	}
	return idempotency.NewSQL(s.db.DB, s.db.Dialect, opts...)
}

// locked counts the prefix's rows whose lease has not run out by the
// database's clock, the one the store's statements read.
func (s sqlKeys) locked(ctx context.Context, prefix string) (bool, error) {
	var n int
	err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+s.table+" WHERE id LIKE "+s.db.Dialect.Placeholder(1)+
		" AND holder <> '' AND holder_until > "+keyspace.SQLNow(s.db.Dialect), likePrefix(prefix)).Scan(&n)
	return n > 0, err
}

func (s sqlKeys) records(ctx context.Context, prefix string) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT id FROM "+s.table+" WHERE id LIKE "+s.db.Dialect.Placeholder(1), likePrefix(prefix))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var id []byte // VARBINARY on MySQL
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		if name := string(id); strings.HasSuffix(name, ":r") {
			names = append(names, name)
		}
	}
	return names, rows.Err()
}

func (s sqlKeys) record(ctx context.Context, name string) (string, error) {
	var text []byte
	err := s.db.QueryRowContext(ctx, "SELECT record FROM "+s.table+" WHERE id = "+s.db.Dialect.Placeholder(1)+
		" AND record_until > "+keyspace.SQLNow(s.db.Dialect), name).Scan(&text)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return string(text), err
}

// likePrefix matches the ids that begin with prefix and a colon; prefixes
// are letters and digits, with nothing LIKE reads as a wildcard.
func likePrefix(prefix string) string { return prefix + ":%" }

// stall holds the keys table locked for d from a connection of the
// checker's own, as a stalled server would hold every statement: the
// instances' connections stay open and their statements wait, until their
// store timeout ends them or the lock goes.
func (s sqlKeys) stall(d time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	var take, give []string
	switch s.db.Dialect {
	case sqldialect.PostgreSQL:
		take, give = []string{"BEGIN", "LOCK TABLE " + s.table + " IN ACCESS EXCLUSIVE MODE"}, []string{"ROLLBACK"}
	case sqldialect.MySQL:
		take, give = []string{"LOCK TABLES " + s.table + " WRITE"}, []string{"UNLOCK TABLES"}
	default: // SQLite: the database's one write lock
		take, give = []string{"BEGIN EXCLUSIVE"}, []string{"ROLLBACK"}
	}
	began := time.Now()
	if err := execAll(ctx, conn, take); err != nil {
		execAll(context.Background(), conn, give)
		return "", err
	}
	waited := time.Since(began)
	time.Sleep(d)
	if err := execAll(ctx, conn, give); err != nil {
		return "", err
	}
	return fmt.Sprintf("the keys table locked by another connection for %v (after waiting %v for the lock)",
		d, waited.Round(time.Millisecond)), nil
}

func execAll(ctx context.Context, conn *sql.Conn, statements []string) error {
	for _, q := range statements {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// restartDatabase is the database restarted as its clients see it: every
// connection of every instance dropped, and new ones refused for down (0:
// the connections dropped, and new ones accepted at once). The data stays,
// as a database's does across a restart; Redis restarted empty is another
// fault (restart_test.go).
func (r *rig) restartDatabase(down time.Duration) string {
	for _, p := range r.instances {
		p.proxy.Refuse()
	}
	time.Sleep(down)
	for _, p := range r.instances {
		if err := p.proxy.EndRefuse(); err != nil {
			r.fail("listening again after a database restart: %v", err)
		}
	}
	if down == 0 {
		return "every connection to the database dropped"
	}
	return fmt.Sprintf("every connection to the database dropped, and new ones refused for %v", down)
}

// stallDatabase stalls the SQL database for d.
func (r *rig) stallDatabase(d time.Duration) string {
	what, err := r.keys.(sqlKeys).stall(d)
	if err != nil {
		r.fail("stalling the database: %v", err)
		return "no stall"
	}
	return what
}

// newProxy is a fault proxy in front of the store's server for one
// instance; nil when the store has none.
func (r *rig) newProxy() *redistest.Proxy {
	if addr := r.keys.server(); addr != "" {
		return redistest.NewProxy(r.t, addr)
	}
	return nil
}

// watchDatabase marks each window in which the database took starvedAfter
// or more to commit a one-row write of the checker's own, until stop
// closes. A database server is a process too: on a machine busy with other
// work it answers late, and an instance's statement misses its store
// timeout with nothing between the two. Redis answers from memory on one
// thread; a database's commit waits for its log, its locks and its
// backends' turn, so its slowness is watched as the processes' scheduling
// is (starved_test.go), and excused the same way.
func (r *rig) watchDatabase(stop <-chan struct{}) {
	s := r.keys.(sqlKeys)
	ticker := time.NewTicker(2 * starvedTick)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		began := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := s.db.ExecContext(ctx, "UPDATE "+s.probe+" SET n = n + 1 WHERE id = 1")
		cancel()
		if took := time.Since(began); took >= starvedAfter || err != nil {
			what := fmt.Sprintf("the database took %v to commit a write of the checker's (the machine is busy)", took.Round(time.Millisecond))
			if err != nil {
				what = fmt.Sprintf("the database did not commit a write of the checker's: %v", err)
			}
			r.markSlow(-1, began, time.Now(), what)
		}
	}
}

// newProbe makes the table watchDatabase writes to.
func (s sqlKeys) newProbe() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, "CREATE TABLE "+s.probe+" (id INT PRIMARY KEY, n BIGINT NOT NULL)"); err != nil {
		return err
	}
	_, err := s.db.ExecContext(ctx, "INSERT INTO "+s.probe+" (id, n) VALUES (1, 0)")
	return err
}
