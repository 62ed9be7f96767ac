// Command ourspg serves the side-by-side benchmark's trivial handler behind
// this library in key mode with its keys in PostgreSQL (NewSQL), on a table
// of its own (-table), through pgx's database/sql driver with the pool
// every server on PostgreSQL has (bench/peers/peer).
package main

import (
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/bench/peers/peer"
)

func main() {
	f := peer.ParsePostgresFlags()
	db := peer.OpenCounted(stdlib.GetDefaultDriver(), f.Postgres)
	defer db.Close()
	m := idempotency.NewSQL(db, idempotency.PostgreSQL, idempotency.WithCallerCredentials(), idempotency.WithSQLTable(f.Table))
	peer.Serve(f, m.ProtectKey(peer.Handler(f.Instance)), idempotency.ReplayedHeader)
}
