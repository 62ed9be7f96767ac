// Package cacheclock lets idemtest move the clock of the in-process
// response cache of every Middleware on its in-process Redis together with
// that Redis's (FastForward), so that an answer whose record has expired
// there is not replayed from memory either. Only modules of this
// repository can import it: the public API has no clock to set.
package cacheclock

import (
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var clocks sync.Map // redis.UniversalClient → func() time.Time

// Set makes now the clock of the response cache of every Middleware that
// New makes on client from then on, until Forget.
func Set(client redis.UniversalClient, now func() time.Time) { clocks.Store(client, now) }

// Forget gives client's Middlewares made from then on the wall clock.
func Forget(client redis.UniversalClient) { clocks.Delete(client) }

// Of is the clock Set gave client; nil for the wall clock.
func Of(client redis.UniversalClient) func() time.Time {
	if now, ok := clocks.Load(client); ok {
		return now.(func() time.Time)
	}
	return nil
}
