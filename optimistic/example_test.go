package optimistic_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/optimistic"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"
)

// openExampleDB opens an in-memory SQLite database with one account at
// version 0. One connection only: with database/sql every pooled
// connection to ":memory:" would be a database of its own.
func openExampleDB() *sql.DB {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		panic(err)
	}
	db.SetMaxOpenConns(1)
	_, err = db.Exec(`CREATE TABLE accounts (
		id      INTEGER PRIMARY KEY,
		balance INTEGER NOT NULL,
		version INTEGER NOT NULL DEFAULT 0,
		fence   INTEGER NOT NULL DEFAULT 0)`)
	if err != nil {
		panic(err)
	}
	if _, err := db.Exec(`INSERT INTO accounts (id, balance) VALUES (1, 100)`); err != nil {
		panic(err)
	}
	return db
}

var exampleRedis struct {
	once sync.Once
	opts *redis.Options
}

// exampleClient returns a client for the package's test Redis, with what
// earlier runs of the examples left under "example-optimistic:" deleted.
func exampleClient() *redis.Client {
	exampleRedis.once.Do(func() {
		opts, err := redistest.SharedOptions()
		if err != nil {
			panic(err)
		}
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		if err := redistest.DeleteKeys(rdb, "example-optimistic:"); err != nil {
			panic(err)
		}
		exampleRedis.opts = opts
	})
	return redis.NewClient(exampleRedis.opts)
}

func ExampleTable_Update() {
	ctx := context.Background()
	db := openExampleDB()
	defer db.Close()
	accounts := optimistic.Table{Dialect: optimistic.SQLite, Name: "accounts"}

	var balance, version int64
	db.QueryRowContext(ctx, "SELECT balance, version FROM accounts WHERE id = ?", 1).Scan(&balance, &version)
	v, err := accounts.Update(ctx, db, 1, version, optimistic.Set("balance", balance+50))
	fmt.Println("new version:", v, err)

	// A second writer that read before the first one wrote is refused.
	_, err = accounts.Update(ctx, db, 1, version, optimistic.Set("balance", balance-30))
	var conflict *optimistic.ConflictError
	if errors.As(err, &conflict) {
		fmt.Println("conflict:", errors.Is(err, optimistic.ErrConflict), "current version:", conflict.Current)
	}

	_, err = accounts.Update(ctx, db, 2, 0, optimistic.Set("balance", 1))
	fmt.Println("missing row:", errors.Is(err, optimistic.ErrNotFound))
	// Output:
	// new version: 1 <nil>
	// conflict: true current version: 1
	// missing row: true
}

func ExampleRetry() {
	ctx := context.Background()
	db := openExampleDB()
	defer db.Close()
	accounts := optimistic.Table{Dialect: optimistic.SQLite, Name: "accounts"}

	runs := 0
	deposit := func(ctx context.Context) error {
		runs++
		var balance, version int64
		err := db.QueryRowContext(ctx, "SELECT balance, version FROM accounts WHERE id = ?", 1).Scan(&balance, &version)
		if err != nil {
			return err // not a conflict: Retry stops
		}
		if runs == 1 {
			// Another writer slips in between our read and our write.
			accounts.Update(ctx, db, 1, version, optimistic.Set("balance", balance+1000))
		}
		_, err = accounts.Update(ctx, db, 1, version, optimistic.Set("balance", balance+10))
		return err
	}
	err := optimistic.Retry(ctx, optimistic.Policy{}, deposit)

	var balance int64
	db.QueryRow("SELECT balance FROM accounts WHERE id = 1").Scan(&balance)
	fmt.Println("runs:", runs, "error:", err, "balance:", balance)
	// Output:
	// runs: 2 error: <nil> balance: 1110
}

func ExampleHash_CompareAndSet() {
	ctx := context.Background()
	rdb := exampleClient()
	defer rdb.Close()
	var accounts optimistic.Hash // the version lives in the field "version"
	key := "example-optimistic:acct:1"

	fields, version, _ := accounts.Read(ctx, rdb, key)
	fmt.Println("before:", len(fields), "fields, version", version)

	v, err := accounts.CompareAndSet(ctx, rdb, key, version, map[string]any{"owner": "ann", "balance": 100})
	fmt.Println("created at version", v, err)

	// A writer still holding version 0 is refused.
	_, err = accounts.CompareAndSet(ctx, rdb, key, version, map[string]any{"balance": 0})
	var conflict *optimistic.ConflictError
	errors.As(err, &conflict)
	fmt.Println("conflict:", errors.Is(err, optimistic.ErrConflict), "current version:", conflict.Current)

	fields, version, _ = accounts.Read(ctx, rdb, key)
	fmt.Println("after:", fields["owner"], fields["balance"], "version", version)
	// Output:
	// before: 0 fields, version 0
	// created at version 1 <nil>
	// conflict: true current version: 1
	// after: ann 100 version 1
}

func ExampleTable_FencedUpdate() {
	ctx := context.Background()
	db := openExampleDB()
	defer db.Close()
	accounts := optimistic.Table{Dialect: optimistic.SQLite, Name: "accounts"}

	// In a protected handler the token is idempotency.FencingToken(ctx).
	// Executor B took the key over from A, so B's token is higher.
	const tokenA, tokenB = 1_700_000_000_000_000, 1_700_000_000_250_000

	err := accounts.FencedUpdate(ctx, db, 1, tokenB, optimistic.Set("balance", 150))
	fmt.Println("B:", err)

	// A wakes from its pause and writes late.
	err = accounts.FencedUpdate(ctx, db, 1, tokenA, optimistic.Set("balance", 80))
	fmt.Println("A stale:", errors.Is(err, optimistic.ErrStaleFence))

	var balance int64
	db.QueryRow("SELECT balance FROM accounts WHERE id = 1").Scan(&balance)
	fmt.Println("balance:", balance)
	// Output:
	// B: <nil>
	// A stale: true
	// balance: 150
}

func ExampleHash_FencedSet() {
	ctx := context.Background()
	rdb := exampleClient()
	defer rdb.Close()
	var orders optimistic.Hash // the token lives in the field "fence"
	key := "example-optimistic:order:1"
	const tokenA, tokenB = 1_700_000_000_000_000, 1_700_000_000_250_000

	fmt.Println("B:", orders.FencedSet(ctx, rdb, key, tokenB, map[string]any{"status": "paid by B"}))

	err := orders.FencedSet(ctx, rdb, key, tokenA, map[string]any{"status": "paid by A"})
	var stale *optimistic.StaleFenceError
	errors.As(err, &stale)
	fmt.Println("A stale:", errors.Is(err, optimistic.ErrStaleFence), "hash holds", stale.Current)
	fmt.Println("status:", rdb.HGet(ctx, key, "status").Val())
	// Output:
	// B: <nil>
	// A stale: true hash holds 1700000000250000
	// status: paid by B
}
