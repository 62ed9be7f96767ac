package idempotency

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// connectedClients reads connected_clients from INFO clients.
func connectedClients(t testing.TB, rdb redis.Cmdable) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "clients").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
			n, err := strconv.Atoi(v)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no connected_clients in %q", info)
	return 0
}

// 500 calls on one instance wait for keys that another instance is running,
// against a Redis whose maxclients fits the instances' pools and a few
// more. The waits share one connection, so a fresh key on a third instance
// is answered as usual, and every waiter gets its key's result once it is
// stored, none running it a second time.
func TestWaitersShareOneConnection(t *testing.T) {
	const waiters, pool = 500, 8
	// Three pools, the test's own connection, and room for a few more.
	srv := redistest.Private(t, "--maxclients", "32")
	instance := func() *Middleware {
		opts := srv.Options()
		opts.PoolSize = pool
		opts.PipelinePoolSize = -1 // pipelines share the pool: one figure bounds the connections
		rdb := redis.NewClient(opts)
		t.Cleanup(func() { rdb.Close() })
		// A generous store timeout: 500 stores at once queue for a pool of 8.
		return New(rdb, WithWaitTimeout(time.Minute), WithStoreTimeout(10*time.Second))
	}
	holder, waiting, fresh := instance(), instance(), instance()
	admin := srv.Client(t)

	key := func(i int) Key { return Key{ID: "k-" + strconv.Itoa(i), Input: []byte("x")} }
	var running atomic.Int64
	finish := make(chan struct{})
	slow := func(i int) func(context.Context) (string, error) {
		return func(context.Context) (string, error) {
			running.Add(1)
			<-finish
			return "result-" + strconv.Itoa(i), nil
		}
	}
	var held, waited sync.WaitGroup
	heldErrs := make([]error, waiters)
	for i := range waiters {
		held.Go(func() { _, heldErrs[i] = Do(context.Background(), holder, key(i), slow(i)) })
	}
	require.Eventually(t, func() bool { return running.Load() == waiters }, 30*time.Second, 10*time.Millisecond)

	var ranAgain atomic.Int64
	results, errs := make([]string, waiters), make([]error, waiters)
	for i := range waiters {
		waited.Go(func() {
			results[i], errs[i] = Do(context.Background(), waiting, key(i), func(context.Context) (string, error) {
				ranAgain.Add(1)
				return "", nil
			})
		})
	}
	// Every waiter has subscribed and raised its key's flag.
	require.Eventually(t, func() bool {
		flags, err := admin.Keys(context.Background(), "idem:*:r:w").Result()
		return err == nil && len(flags) == waiters
	}, 30*time.Second, 50*time.Millisecond, "every waiter subscribes")
	clients := connectedClients(t, admin)

	v, err := Do(context.Background(), fresh, Key{ID: "fresh"}, func(context.Context) (string, error) { return "fresh", nil })
	require.NoError(t, err, "a fresh key on another instance is answered while 500 calls wait")
	require.Equal(t, "fresh", v)

	close(finish)
	held.Wait()
	waited.Wait()
	for i := range waiters {
		require.NoError(t, heldErrs[i])
		require.NoError(t, errs[i])
		require.Equal(t, fmt.Sprint("result-", i), results[i])
	}
	require.Zero(t, ranAgain.Load(), "no waiter ran its key again")
	t.Logf("%d calls waiting on one instance: Redis had %d clients (maxclients 32, pools of %d)", waiters, clients, pool)
	require.LessOrEqual(t, clients, 3*pool+1+3, "the pools, the test's connection and one subscription per instance")
}

// fillConnections opens connections to addr until Redis refuses one
// (maxclients), as another tenant of the server would, and closes them when
// the test ends.
func fillConnections(t *testing.T, addr string) {
	t.Helper()
	for range 10000 {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		_, err = conn.Write([]byte("PING\r\n"))
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "+PONG") {
			return // refused: Redis takes no more connections
		}
	}
	t.Fatal("Redis never refused a connection")
}

// A Redis at maxclients still serves the connections the instances pooled,
// but refuses the one their waits would share. Each waiter still gives up
// after its wait timeout: none queues behind another's attempt to open that
// connection.
func TestWaitersKeepTheirTimeoutWhileRedisTakesNoConnection(t *testing.T) {
	const waiters, pool = 40, 4
	const wait, storeTimeout = time.Second, 500 * time.Millisecond
	srv := redistest.Private(t, "--maxclients", "24")
	instance := func() (*Middleware, *redis.Client) {
		opts := srv.Options()
		opts.PoolSize, opts.PipelinePoolSize = pool, -1
		rdb := redis.NewClient(opts)
		t.Cleanup(func() { rdb.Close() })
		return New(rdb, WithWaitTimeout(wait), WithStoreTimeout(storeTimeout)), rdb
	}
	holder, holderClient := instance()
	waiting, waitingClient := instance()
	for _, rdb := range []*redis.Client{holderClient, waitingClient} {
		var warm sync.WaitGroup
		for range pool {
			// Each holds a connection of its own for a moment: the pool
			// opens all of them now, while Redis still takes connections.
			warm.Go(func() {
				require.ErrorIs(t, rdb.BLPop(context.Background(), 50*time.Millisecond, "warm").Err(), redis.Nil)
			})
		}
		warm.Wait()
	}

	key := func(i int) Key { return Key{ID: "k-" + strconv.Itoa(i), Input: []byte("x")} }
	var running atomic.Int64
	finish := make(chan struct{})
	var held sync.WaitGroup
	for i := range waiters {
		held.Go(func() {
			Do(context.Background(), holder, key(i), func(context.Context) (string, error) {
				running.Add(1)
				<-finish
				return "done", nil
			})
		})
	}
	defer held.Wait()
	defer close(finish)
	require.Eventually(t, func() bool { return running.Load() == waiters }, 30*time.Second, 10*time.Millisecond)
	fillConnections(t, srv.Addr())

	var ranAgain atomic.Int64
	took, errs := make([]time.Duration, waiters), make([]error, waiters)
	var waited sync.WaitGroup
	for i := range waiters {
		waited.Go(func() {
			began := time.Now()
			_, errs[i] = Do(context.Background(), waiting, key(i), func(context.Context) (string, error) {
				ranAgain.Add(1)
				return "", nil
			})
			took[i] = time.Since(began)
		})
	}
	waited.Wait()
	require.Zero(t, ranAgain.Load(), "no waiter ran a key that another instance runs")
	// The wait, then a last try of the lock within the store timeout, and
	// room for a busy machine; a waiter that queued behind the others'
	// attempts to subscribe took about ten times as long.
	bound := wait + 2*storeTimeout + 2*time.Second
	for i := range waiters {
		require.Error(t, errs[i])
		require.Less(t, took[i], bound, "waiter %d took %v with a wait timeout of %v", i, took[i], wait)
	}
}
