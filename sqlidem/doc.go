// Package sqlidem commits a protected handler's answer in the same SQL
// transaction as the handler's writes, so that a crash can neither run the
// writes twice nor leave the request's key interrupted.
//
// A Store keeps one row per idempotency key. Store.Handler runs a TxFunc
// in a transaction and writes the answer's row last: a crash before the
// commit leaves nothing (the retry runs again), a crash after it leaves the
// answer (the retry replays it), and a second execution of the key cannot
// commit (its writes roll back with the row that cannot go in). Given to
// the middleware with idempotency.WithOutcomeStore, the Store also answers
// for executions whose instance died before Redis stored their answer.
// With the middleware's keys in the same database (idempotency.NewSQL on
// the same *sql.DB), the key's answer commits in the transaction too
// (idempotency.StoreAnswerInTx), and there is no Redis at all.
//
// Only database/sql is imported; register the driver of your database
// (pgx, go-sql-driver/mysql, modernc.org/sqlite, …) and name its Dialect.
// See docs/outcomes.md in the repository for what it guarantees and what
// it does not.
package sqlidem
