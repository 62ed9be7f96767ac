package optimistic

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/syncbuf"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// write is what one execution's handler did to storage.
type write struct {
	instance string
	token    uint64
	fenced   error // FencedUpdate of row 1
	hash     error // FencedSet of the order hash
	plain    error // an unfenced UPDATE of row 2, for comparison
}

// TestFencingStopsAPausedExecutor plays the classic failure of leases with
// the real middleware. Instance A claims a key and starts its handler, then
// stalls (a GC pause, a VM migration): its Redis traffic stops, so its lease
// is not renewed and runs out. Instance B gets a retry of the same request,
// takes the key over (WithRetryAbandoned) with a higher fencing token and
// writes. Then A wakes and writes too, before it can learn it lost the key.
// The fenced writes refuse A; the unfenced one lets A overwrite B's result.
func TestFencingStopsAPausedExecutor(t *testing.T) {
	redisOpts, err := redistest.SharedOptions()
	require.NoError(t, err)
	eachDB(t, func(t *testing.T, d *testDB) {
		prefix := "test-optimistic-" + strings.ReplaceAll(t.Name(), "/", "-")
		rdb := redistest.Client(t, prefix) // instance B's Redis, and the store of the fenced hash

		// Instance A reaches Redis only through a proxy the test can stall.
		// With ContextTimeoutEnabled its watchdog's renewals fail within
		// their step timeout instead of blocking on the socket.
		px := startProxy(t, redisOpts.Addr)
		optsA := *redisOpts
		optsA.Dialer = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return new(net.Dialer).DialContext(ctx, "tcp", px.addr())
		}
		optsA.ContextTimeoutEnabled = true
		rdbA := redis.NewClient(&optsA)
		t.Cleanup(func() { rdbA.Close() })

		orders := d.accounts(t, map[int64]int64{1: 0, 2: 0})
		plain := d.rebind("UPDATE " + orders.Name + " SET owner = ? WHERE id = ?")
		hashKey := prefix + ":order"
		writes := make(chan write, 2)
		started, wake := make(chan uint64, 1), make(chan struct{})
		handler := func(instance string, pause bool) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx := r.Context()
				token := idempotency.FencingToken(ctx)
				if pause {
					started <- token
					<-wake
					// The middleware's watchdog may have cancelled ctx by now
					// (no renewal for a lease); a real pause can strike after
					// the handler's last look at ctx, so the write goes out
					// regardless, and only the fence can stop it.
					ctx = context.WithoutCancel(ctx)
				}
				wr := write{instance: instance, token: token}
				wr.fenced = orders.FencedUpdate(ctx, d.db, 1, token, Set("owner", instance))
				wr.hash = Hash{}.FencedSet(ctx, rdb, hashKey, token, map[string]any{"owner": instance})
				_, wr.plain = d.db.ExecContext(ctx, plain, instance, 2)
				writes <- wr
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, instance)
			})
		}
		var logs syncbuf.Buffer
		opts := []idempotency.Option{
			idempotency.WithKeyPrefix(prefix),
			idempotency.WithCallerCredentials(),
			idempotency.WithLockLease(100 * time.Millisecond),
			idempotency.WithRetryAbandoned(),
			idempotency.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		}
		srvA := httptest.NewServer(idempotency.New(rdbA, opts...).ProtectKey(handler("A", true)))
		t.Cleanup(srvA.Close)
		srvB := httptest.NewServer(idempotency.New(rdb, opts...).ProtectKey(handler("B", false)))
		t.Cleanup(srvB.Close)
		var wakeOnce sync.Once
		wakeA := func() { wakeOnce.Do(func() { close(wake) }) }
		// Registered after the servers, so it runs before they close: a
		// failing test must not leave A's handler blocked, or Close waits.
		t.Cleanup(func() { wakeA(); px.resume() })

		answerA := make(chan paid, 1)
		go func() {
			a, err := tryPay(srvA.URL)
			answerA <- paid{a, err}
		}()
		tokenA := receive(t, started)
		px.pause() // A stalls mid-handler; its lease runs out in 100 ms

		b := pay(t, srvB.URL)
		require.Equal(t, answer{status: http.StatusCreated, body: "B"}, b, "B took the abandoned key over")
		wb := receive(t, writes)
		require.Greater(t, wb.token, tokenA, "the takeover carries a higher fencing token")
		require.NoError(t, wb.fenced)
		require.NoError(t, wb.hash)
		require.NoError(t, wb.plain)

		// A wakes and writes at once, its network still stalled.
		wakeA()
		wa := receive(t, writes)
		px.resume()
		require.Equal(t, tokenA, wa.token)
		require.ErrorIs(t, wa.fenced, ErrStaleFence)
		var stale *StaleFenceError
		require.ErrorAs(t, wa.fenced, &stale)
		require.Equal(t, wb.token, stale.Current)
		require.ErrorIs(t, wa.hash, ErrStaleFence)
		require.NoError(t, wa.plain, "nothing stops the unfenced write")

		fenced, unfenced := d.row(t, orders, 1), d.row(t, orders, 2)
		require.Equal(t, "B", fenced.owner.String, "the fence kept B's write")
		require.EqualValues(t, wb.token, fenced.fence)
		require.Equal(t, "A", unfenced.owner.String, "without the fence the stale executor overwrote B's write")
		require.Equal(t, "B", rdb.HGet(t.Context(), hashKey, "owner").Val())

		// A's own client still gets A's answer, but the middleware refused
		// to store it over B's: the record keeps B's response.
		a := receive(t, answerA)
		require.NoError(t, a.err)
		require.Equal(t, answer{status: http.StatusCreated, body: "A"}, a.answer)
		require.Contains(t, logs.String(), "lock lost")
		replay := pay(t, srvA.URL)
		require.Equal(t, answer{status: http.StatusCreated, body: "B", replayed: true}, replay)
	})
}

// answer is what a client of the shop got.
type answer struct {
	status   int
	body     string
	replayed bool
}

func pay(t *testing.T, base string) answer {
	t.Helper()
	a, err := tryPay(base)
	require.NoError(t, err)
	return a
}

// tryPay is pay for a goroutine that is not the test's: it returns the
// error for the test to check.
func tryPay(base string) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/orders/1/pay", strings.NewReader(`{"amount":10}`))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set(idempotency.KeyHeader, "order-1-payment")
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(body), replayed: resp.Header.Get(idempotency.ReplayedHeader) == "true"}, err
}

// paid is what tryPay returned.
type paid struct {
	answer
	err error
}

// receive bounds every wait of the test, so a regression fails instead of
// hanging.
func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("timed out")
		panic("unreachable")
	}
}
