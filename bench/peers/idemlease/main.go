//go:build ignore

// Command idemlease serves the side-by-side benchmark's trivial handler
// behind github.com/repenguin22/idemlease v1.1.0 itself: its net/http
// middleware (package httpidem) on its Redis store (module
// github.com/repenguin22/idemlease/redistore v1.1.0), wired as its README
// shows for production, with Require(true) and every other option at its
// default: the key in Idempotency-Key, a 30 s lease that is never renewed,
// answers kept 24 h, a SHA-256 fingerprint of the method, the path, the
// query and the body, 409 while a key runs, fail-closed, a replay marked
// Idempotency-Replayed. The Redis client is configured as the other
// servers' are.
//
// The module proxy does not serve idemlease, so nothing in this repository
// requires it: the build constraint keeps this file out of every build, go
// mod tidy and go vet, and bench/sidebyside builds it, when IDEMLEASE_DIR
// (or -idemlease) names an extracted idemlease tree, as a module of its own
// outside the repository (see bench/sidebyside/idemlease.go).
package main

import (
	"github.com/onceonly/idempotency/bench/peers/peer"
	"github.com/redis/go-redis/v9"
	"github.com/repenguin22/idemlease/httpidem"
	"github.com/repenguin22/idemlease/redistore"
)

func main() {
	f := peer.ParseFlags(true)
	rdb := redis.NewClient(&redis.Options{Addr: f.Redis, PoolSize: 64, ContextTimeoutEnabled: true})
	defer rdb.Close()
	mw := httpidem.New(redistore.New(rdb), httpidem.Require(true))
	peer.Serve(f, mw(peer.Handler(f.Instance)), httpidem.HeaderIdempotencyReplayed)
}
