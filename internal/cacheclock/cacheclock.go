// Package cacheclock lets idemtest move the clock of a Middleware's
// in-process response cache together with its in-process Redis's
// (FastForward), so that an answer whose record has expired there is not
// replayed from memory either. Only modules of this repository can import
// it: the public API has no clock to set.
package cacheclock

import "time"

// Option returns an idempotency.Option (as any, since this package cannot
// import the one that fills it in) under which the response cache reads
// the time from now instead of time.Now.
var Option func(now func() time.Time) any
