//go:build ignore

// Command idemleasepg serves the side-by-side benchmark's trivial handler
// behind github.com/repenguin22/idemlease v1.1.0 itself on its PostgreSQL
// store (module github.com/repenguin22/idemlease/pgstore v1.1.0), wired as
// its README shows: the table created first with pgstore.Schema (here, at
// start-up, named by -table), then httpidem.New(pgstore.New(db,
// pgstore.Table(...)), Require(true)), every other option at its default.
// The database is reached through pgx's database/sql driver with the pool
// every server on PostgreSQL has (bench/peers/peer).
//
// Like bench/peers/idemlease, this file is kept out of every build of the
// bench module: bench/sidebyside builds it as a module of its own when
// IDEMLEASE_DIR (or -idemlease) names an extracted idemlease tree with its
// pgstore (see bench/sidebyside/idemlease.go).
package main

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/onceonly/idempotency/bench/peers/peer"
	"github.com/repenguin22/idemlease/httpidem"
	"github.com/repenguin22/idemlease/pgstore"
)

func main() {
	f := peer.ParsePostgresFlags()
	db := peer.OpenCounted(stdlib.GetDefaultDriver(), f.Postgres)
	defer db.Close()
	if _, err := db.ExecContext(context.Background(), pgstore.Schema(f.Table)); err != nil {
		log.Fatalf("creating %s: %v", f.Table, err)
	}
	mw := httpidem.New(pgstore.New(db, pgstore.Table(f.Table)), httpidem.Require(true))
	peer.Serve(f, mw(peer.Handler(f.Instance)), httpidem.HeaderIdempotencyReplayed)
}
