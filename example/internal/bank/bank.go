// Package bank is the example shop's account transfers: balances in SQL,
// moved by a handler whose writes and answer commit in one transaction
// (sqlidem), so that a transfer executed twice would show as a wrong
// balance. The shop serves it, and so does the crash trial's server, which
// must run the very same handler.
package bank

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"

	"github.com/onceonly/idempotency/example/internal/reply"
	"github.com/onceonly/idempotency/sqlidem"
)

// A Bank keeps accounts and the transfers between them in three tables
// named after one prefix: PREFIXaccounts, PREFIXtransfers and the outcome
// table PREFIXidempotency_outcomes.
type Bank struct {
	db       *sql.DB
	dialect  sqlidem.Dialect
	outcomes *sqlidem.Store

	accounts, transfers string
	// The transfer's statements, bound for the dialect once, by New.
	debit, credit, record, balance string
}

// New returns a Bank on db. It touches no table: Setup creates them. opts
// configure the outcome store; its table is the bank's.
func New(db *sql.DB, dialect sqlidem.Dialect, prefix string, opts ...sqlidem.Option) (*Bank, error) {
	outcomes, err := sqlidem.New(db, dialect, append(opts, sqlidem.WithTable(prefix+sqlidem.DefaultTable))...)
	if err != nil {
		return nil, err
	}
	b := &Bank{
		db: db, dialect: dialect, outcomes: outcomes,
		accounts: prefix + "accounts", transfers: prefix + "transfers",
	}
	b.debit = dialect.Bind("UPDATE " + b.accounts + " SET balance = balance - ? WHERE id = ? AND balance >= ?")
	b.credit = dialect.Bind("UPDATE " + b.accounts + " SET balance = balance + ? WHERE id = ?")
	b.record = dialect.Bind("INSERT INTO " + b.transfers + " (id, from_account, to_account, amount, created_ms) VALUES (?, ?, ?, ?, ?)")
	b.balance = dialect.Bind("SELECT balance FROM " + b.accounts + " WHERE id = ?")
	return b, nil
}

// Outcomes is the store the transfers' answers commit in: the middleware
// that protects Transfer recovers from it (idempotency.WithOutcomeStore).
func (b *Bank) Outcomes() *sqlidem.Store { return b.outcomes }

// DB is the database the bank lives in.
func (b *Bank) DB() *sql.DB { return b.db }

// Tables names the bank's accounts and transfers tables.
func (b *Bank) Tables() (accounts, transfers string) { return b.accounts, b.transfers }

// DemoAccounts are the accounts a new shop opens with, in cents.
var DemoAccounts = map[string]int64{"alice": 100_000, "bob": 50_000, "carol": 25_000}

// Setup creates the bank's tables if they are missing and opens every
// account of seed that does not exist yet with its balance. Several
// instances may run it at once.
func (b *Bank) Setup(ctx context.Context, seed map[string]int64) error {
	if err := b.outcomes.CreateTable(ctx); err != nil {
		return fmt.Errorf("outcome table: %w", err)
	}
	if err := b.createTables(ctx); err != nil {
		return err
	}
	open := "INSERT INTO " + b.accounts + " (id, balance) VALUES (?, ?) ON CONFLICT (id) DO NOTHING"
	if b.dialect == sqlidem.MySQL {
		open = "INSERT IGNORE INTO " + b.accounts + " (id, balance) VALUES (?, ?)"
	}
	for id, balance := range seed {
		if _, err := b.db.ExecContext(ctx, b.dialect.Bind(open), id, balance); err != nil {
			return fmt.Errorf("opening account %q: %w", id, err)
		}
	}
	return nil
}

// createTables creates the accounts and transfers tables if they are
// missing. Two PostgreSQL sessions that create one table at the same
// moment collide, IF NOT EXISTS or not (a unique violation in its
// catalog): there the instances take turns, under a transaction-scoped
// advisory lock.
func (b *Bank) createTables(ctx context.Context) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if b.dialect == sqlidem.PostgreSQL {
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", "bank setup "+b.accounts); err != nil {
			return err
		}
	}
	for _, ddl := range []string{
		"CREATE TABLE IF NOT EXISTS " + b.accounts + ` (
	id      VARCHAR(32) PRIMARY KEY,
	balance BIGINT NOT NULL
)`,
		"CREATE TABLE IF NOT EXISTS " + b.transfers + ` (
	id           VARCHAR(40) PRIMARY KEY,
	from_account VARCHAR(32) NOT NULL,
	to_account   VARCHAR(32) NOT NULL,
	amount       BIGINT NOT NULL,
	created_ms   BIGINT NOT NULL
)`,
	} {
		if _, err := tx.ExecContext(ctx, ddl); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// An Account is one balance, in cents.
type Account struct {
	ID      string `json:"id"`
	Balance int64  `json:"balance"`
}

// Accounts returns every account, by id.
func (b *Bank) Accounts(ctx context.Context) ([]Account, error) {
	rows, err := b.db.QueryContext(ctx, "SELECT id, balance FROM "+b.accounts+" ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Account{}
	for rows.Next() {
		var a Account
		if err := rows.Scan(&a.ID, &a.Balance); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// ListAccounts answers GET /accounts.
func (b *Bank) ListAccounts(w http.ResponseWriter, r *http.Request) {
	accounts, err := b.Accounts(r.Context())
	if err != nil {
		reply.Problem(w, http.StatusServiceUnavailable, "database-unavailable", "the accounts cannot be read now; try again")
		return
	}
	reply.JSON(w, http.StatusOK, accounts)
}
