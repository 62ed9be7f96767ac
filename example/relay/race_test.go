//go:build race

package main

// raceEnabled builds the example under the race detector too when the
// tests run under it.
const raceEnabled = true
