// Package optimistic makes the writes of a handler safe when two executions
// race, in SQL (database/sql) and in Redis.
//
// The idempotency middleware makes sure one request runs once. It cannot
// stop two different requests from reading the same row and both writing
// it back (a lost update), and it cannot stop an executor that paused past
// its lock lease from writing after another executor took its key over.
// This package covers both:
//
//   - Versions (optimistic concurrency). Table.Update writes a row only if
//     it is still at the version the caller read, and bumps the version;
//     Hash.CompareAndSet does the same for a Redis hash in one Lua script.
//     A refused write returns an error matching ErrConflict, and Retry
//     re-runs a read-modify-write function on conflicts with bounded,
//     jittered back-off.
//   - Fences. Table.FencedUpdate and Hash.FencedSet write only if the
//     writer's fencing token (idempotency.FencingToken(ctx) in a protected
//     handler) is above the highest token the row or hash has accepted, so
//     a stale executor's late write fails with ErrStaleFence instead of
//     overwriting its successor's.
//
// A versioned read-modify-write loop:
//
//	accounts := optimistic.Table{Dialect: optimistic.PostgreSQL, Name: "accounts"}
//	err := optimistic.Retry(ctx, optimistic.Policy{}, func(ctx context.Context) error {
//		var balance, version int64
//		err := db.QueryRowContext(ctx, "SELECT balance, version FROM accounts WHERE id = $1", id).
//			Scan(&balance, &version)
//		if err != nil {
//			return err
//		}
//		_, err = accounts.Update(ctx, db, id, version, optimistic.Set("balance", balance+amount))
//		return err
//	})
//
// A fenced write inside a handler protected with WithRetryAbandoned:
//
//	func payOrder(w http.ResponseWriter, r *http.Request) {
//		err := orders.FencedUpdate(r.Context(), db, orderID, idempotency.FencingToken(r.Context()),
//			optimistic.Set("status", "paid"))
//		if errors.Is(err, optimistic.ErrStaleFence) {
//			return // another execution owns this key now; it writes the result
//		}
//		// … the payment, then the answer
//	}
//
// The SQL helpers take a Querier (*sql.DB, *sql.Conn or *sql.Tx) and a
// Table that names the table and its id, version and fence columns. Names
// are validated and quoted for the Table's Dialect (SQLite, PostgreSQL,
// MySQL/MariaDB), so none can inject SQL, and values travel as parameters
// (? or $n by dialect). The Redis helpers take redis.Scripter (any client,
// Cluster included) and touch one key per call.
package optimistic
