package idempotency

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Options under which the lease cannot hold are refused at New, with a
// message that names the option.
func TestNewRefusesLeasesThatCannotHold(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for name, opts := range map[string][]Option{
		"WithRecordTTL":          {WithRecordTTL(10 * time.Second)}, // below 3 s lease + 30 s execution
		"WithExpiryHeader":       {WithExpiryHeader("Expires In")},
		"WithUnprotectedMethods": {WithUnprotectedMethods("")},
		"WithReplicaAcks":        {WithLockLease(300 * time.Millisecond), WithReplicaAcks(1, 2*time.Second)},
	} {
		msg, _ := panicMessage(func() { New(rdb, opts...) }).(string)
		require.Contains(t, msg, name)
	}
	require.NotPanics(t, func() {
		New(rdb, WithRecordTTL(time.Minute), WithExecutionTimeout(10*time.Second),
			WithLockLease(time.Second), WithReplicaAcks(1, 500*time.Millisecond))
	})
}

func panicMessage(f func()) (msg any) {
	defer func() { msg = recover() }()
	f()
	return nil
}

// Failing open runs a request without its key; behind an outcome store it
// would commit with no outcome row, and its retry would commit again. New
// refuses the pair, for handlers and for Do alike (one Middleware serves
// both).
func TestFailOpenWithAnOutcomeStoreIsRefused(t *testing.T) {
	rdb := newShop(t).rdb
	defer func() {
		msg, _ := recover().(string)
		require.Contains(t, msg, "WithFailOpen cannot be combined with WithOutcomeStore")
	}()
	New(rdb, WithFailOpen())
	New(rdb, WithOutcomeStore(&fakeOutcomes{}))
	New(rdb, WithFailOpen(), WithOutcomeStore(&fakeOutcomes{}))
	t.Fatal("New accepted WithFailOpen with WithOutcomeStore")
}
