package main

import (
	"bufio"
	"crypto/sha1"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/shopproc"
	"github.com/stretchr/testify/require"
)

// Tests that run the example as the program it is, to see what its main
// does with signals and slow clients.

var (
	buildOnce sync.Once
	binary    string
)

func startProcess(t *testing.T, env ...string) *shopproc.Shop {
	t.Helper()
	return shopproc.Start(t, exampleBinary(t), "/orders", 15*time.Second, env...)
}

// exampleBinary builds the example once per test process.
func exampleBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "example-bin-")
		require.NoError(t, err)
		binary = shopproc.Build(t, dir, false)
		// The binary outlives the test that built it: later tests run it.
		removeBinary = func() { os.RemoveAll(dir) }
	})
	return binary
}

// removeBinary deletes the built example once every test ran.
var removeBinary = func() {}

func pay(t *testing.T, base, key string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(`{"amount":500,"currency":"eur"}`))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// SIGTERM lets payments in flight finish and store their answers: their
// clients get them, and a retry on another instance replays them.
func TestSIGTERMFinishesRequestsInFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	redis := redistest.Private(t)
	redisURL := "redis://" + redis.Addr()
	a := startProcess(t, "REDIS_URL="+redisURL, "PAYMENT_LATENCY=600ms")
	b := startProcess(t, "REDIS_URL="+redisURL, "PAYMENT_LATENCY=600ms")

	const n = 5
	type result struct {
		status int
		body   string
		err    error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			status, body, err := pay(t, a.URL, fmt.Sprint("term-", i))
			results[i] = result{status, body, err}
		})
	}
	// Signal once every payment is claimed, and so in its provider call.
	rdb := redis.Client(t)
	require.Eventually(t, func() bool {
		records, err := rdb.Keys(t.Context(), "idem:*:r").Result()
		return err == nil && len(records) == n
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, a.Signal(syscall.SIGTERM))
	wg.Wait()
	select {
	case <-a.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the shop did not exit after SIGTERM")
	}
	for i, r := range results {
		require.NoError(t, r.err, "payment %d got its answer before the shop exited", i)
		require.Equal(t, http.StatusCreated, r.status, r.body)
		status, body, err := pay(t, b.URL, fmt.Sprint("term-", i))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status, "the retry on another instance replays: %s", body)
		require.Equal(t, r.body, body)
	}
	require.Equal(t, n, countOf[Payment](t, b.URL, "/payments"))
}

// SIGTERM during a Redis blip: the payment ran and its client got 201, but
// Redis did not take its answer, which waits in the background. The shop
// stays up until Redis takes it (the drain), so a retry on another
// instance replays the payment instead of finding the key interrupted.
func TestSIGTERMDuringARedisBlipStoresTheAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	redis := redistest.Private(t)
	proxy := redistest.NewProxy(t, redis.Addr())
	a := startProcess(t, "REDIS_URL=redis://"+proxy.Addr(), "PAYMENT_LATENCY=100ms")
	b := startProcess(t, "REDIS_URL=redis://"+redis.Addr())
	// The store's script is complete.lua with the record's layout in front
	// (keyspace.RecordScript); its digest names it on the wire.
	layout, err := os.ReadFile("../internal/keyspace/lua/record.lua")
	require.NoError(t, err)
	complete, err := os.ReadFile("../lua/complete.lua")
	require.NoError(t, err)
	proxy.BlackholeAt(fmt.Sprintf("%x", sha1.Sum(append(layout, complete...)))) // the blip begins at the store

	status, paid, err := pay(t, a.URL, "blip")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, paid)
	require.NoError(t, a.Signal(syscall.SIGTERM))
	select {
	case <-a.Exited():
		t.Fatal("the shop exited with an answer Redis had not taken")
	case <-time.After(500 * time.Millisecond):
	}
	proxy.EndBlackhole()
	select {
	case <-a.Exited():
	case <-time.After(20 * time.Second):
		t.Fatal("the shop did not exit once Redis answered")
	}
	status, again, err := pay(t, b.URL, "blip")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, again)
	require.Equal(t, paid, again, "the retry on another instance replays the payment")
	require.Equal(t, 1, countOf[Payment](t, b.URL, "/payments"))
}

// A client that never finishes sending its body loses its connection.
func TestEndlessBodyIsCutOff(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the example")
	}
	shop := startProcess(t, "REDIS_URL=redis://"+redistest.Private(t).Addr())
	conn, err := net.Dial("tcp", strings.TrimPrefix(shop.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST /payments HTTP/1.1\r\nHost: shop\r\nIdempotency-Key: endless\r\n"+
		"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		io.Copy(io.Discard, bufio.NewReader(conn)) // until the server closes
	}()
	began := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-closed:
			t.Logf("connection closed after %v", time.Since(began).Round(time.Millisecond))
			return
		case <-tick.C:
			conn.Write([]byte(" "))
		}
		require.Less(t, time.Since(began), 5*time.Second, "the server still holds the connection")
	}
}
