// Command bare serves the side-by-side benchmark's trivial handler with no
// middleware: the ceiling the other servers are measured against.
package main

import "github.com/onceonly/idempotency/bench/peers/peer"

func main() {
	f := peer.ParseFlags(false)
	peer.Serve(f, peer.Handler(f.Instance), "")
}
