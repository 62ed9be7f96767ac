package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/orderlog"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/onceonly/idempotency/internal/shopproc"
	"github.com/stretchr/testify/require"
)

// The end-to-end tests run an embedded JetStream server per test, a private
// redis-server, and relays in-process, in both modes: in HTTP mode the
// relays POST to the example shop, run as the separate program it is
// (built once, started per test on a free loopback port, several instances
// behind one Redis); in-process, they run the shop's side effect
// themselves, through idempotency.Do.

const (
	stream        = "ORDERS"
	subject       = "orders.events"
	durable       = "callbacks"
	deadLetterSub = "dlq.orders.events"
)

var (
	buildDir   string
	buildOnce  sync.Once
	shopBinary string
)

func TestMain(m *testing.M) {
	var err error
	if buildDir, err = os.MkdirTemp("", "relay-e2e-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(buildDir)
	os.Exit(code)
}

// shop is one running instance of the example.
type shop struct{ *shopproc.Shop }

// startShop starts an instance of the example on redisAddr; env adds
// variables such as CALLBACK_LATENCY. The example is built once per test
// binary, under the race detector when the tests run under it.
func startShop(t *testing.T, redisAddr string, env ...string) *shop {
	t.Helper()
	buildOnce.Do(func() { shopBinary = shopproc.Build(t, buildDir, raceEnabled) })
	if shopBinary == "" {
		t.Fatal("building the example failed in an earlier test")
	}
	env = append([]string{"REDIS_URL=redis://" + redisAddr}, env...)
	return &shop{shopproc.Start(t, shopBinary, "/callbacks/orders", 15*time.Second, env...)}
}

// A sideEffect is where a relay's messages have their effect: an order
// log, with one entry per message and the count of executions past the
// first.
type sideEffect interface {
	// attach points r at the side effect.
	attach(r *Relay)
	// effects reads the order log so far.
	effects(t *testing.T) recorded
}

// recorded is what an order log holds: each event's entry, and how many
// executions found their event recorded already.
type recorded struct {
	entries []orderlog.Effect
	reruns  int64
}

// A mode starts a side effect on a Redis: latency is the work of every
// event.
type mode struct {
	name  string
	start func(t *testing.T, rdb *redistest.Server, latency time.Duration) sideEffect
	// invalidStatus is the status of the answer to an invalid event.
	invalidStatus int
}

var modes = []mode{
	{name: modeHTTP, invalidStatus: http.StatusBadRequest,
		start: func(t *testing.T, rdb *redistest.Server, latency time.Duration) sideEffect {
			return startShop(t, rdb.Addr(), "CALLBACK_LATENCY="+latency.String())
		}},
	{name: modeInProcess, invalidStatus: http.StatusUnprocessableEntity, start: startInProcess},
}

func (s *shop) attach(r *Relay) { r.Target = s.URL + "/callbacks/orders" }

func (s *shop) effects(t *testing.T) recorded {
	t.Helper()
	resp, err := http.Get(s.URL + "/callbacks/orders")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var rec recorded
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&rec.entries))
	rec.reruns, err = strconv.ParseInt(resp.Header.Get("Callback-Reruns"), 10, 64)
	require.NoError(t, err, "the Callback-Reruns header")
	return rec
}

// inProcess is the order log run by the relay itself, with a middleware and
// a Redis client of its own, as another relay process would have.
type inProcess struct {
	log *orderProcess
	mw  *idempotency.Middleware
}

var instances atomic.Int64

// startInProcess sets up the side effect of the in-process mode as main does.
func startInProcess(t *testing.T, rdb *redistest.Server, latency time.Duration) sideEffect {
	client := rdb.Client(t)
	return &inProcess{
		log: &orderProcess{log: orderlog.New(client, "relay:orders:log", fmt.Sprintf("relay-%d", instances.Add(1))),
			work: latency},
		// A lease longer than the outage test stops Redis for (at most
		// 20 s), so that no run is cancelled for a lost lease while Redis
		// is stopped. Its writes still time out (the client's read
		// timeout), and one whose reply timed out lands when Redis
		// resumes, after the failed run's key was released: the order log
		// then counts the redelivery's execution as a rerun instead of
		// recording the event twice.
		mw: idempotency.New(client, idempotency.WithRetryAbandoned(), idempotency.WithLockLease(30*time.Second),
			idempotency.WithLogger(testLogger(t))),
	}
}

func (p *inProcess) attach(r *Relay) { r.Process, r.Middleware = p.log.process, p.mw }

func (p *inProcess) effects(t *testing.T) recorded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rec recorded
	var err error
	rec.entries, err = p.log.log.Effects(ctx)
	require.NoError(t, err)
	rec.reruns, err = p.log.log.Reruns(ctx)
	require.NoError(t, err)
	return rec
}

// requireOncePerMessage checks that every one of n messages had its side
// effect, and that at most maxReruns executions found their message's
// effect done already. A rerun is the middleware's doing unless an earlier
// execution of the message failed (its key was then released, or taken
// over once its lease ran out): a test without failures allows none.
func requireOncePerMessage(t *testing.T, rec recorded, n int, maxReruns int64) map[string]int {
	t.Helper()
	messages := map[string]bool{}
	perInstance := map[string]int{}
	for _, e := range rec.entries {
		messages[e.Key] = true
		perInstance[e.Instance]++
	}
	require.Len(t, messages, n, "distinct messages with a side effect")
	require.Len(t, rec.entries, n, "side effects")
	require.LessOrEqual(t, rec.reruns, maxReruns, "executions of a message whose effect was done")
	return perInstance
}

// broker is an embedded JetStream server with the order stream and its
// dead-letter stream.
type broker struct {
	url string
	js  jetstream.JetStream
}

func startBroker(t *testing.T, streamCfg jetstream.StreamConfig) *broker {
	t.Helper()
	ns, err := startEmbeddedNATS(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	b := &broker{url: ns.ClientURL()}
	b.js = b.connect(t)
	streamCfg.Name, streamCfg.Subjects = stream, []string{subject}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = b.js.CreateStream(ctx, streamCfg)
	require.NoError(t, err)
	_, err = b.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream + "_DLQ", Subjects: []string{deadLetterSub}})
	require.NoError(t, err)
	return b
}

// connect opens a connection of its own, as a separate relay process has.
func (b *broker) connect(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(b.url, nats.Name(t.Name()))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return js
}

func (b *broker) createConsumer(t *testing.T, ackWait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.js.CreateOrUpdateConsumer(ctx, stream, consumerConfig(durable, subject, ackWait))
	require.NoError(t, err)
}

// runningRelay is a relay on a connection of its own, running until stop.
type runningRelay struct {
	*Relay
	conn   *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

// stop cancels the relay and closes its connection, as a crash would: what
// it had in flight is never acked.
func (r *runningRelay) stop() {
	r.cancel()
	<-r.done
	r.conn.Close()
}

// startRelay starts a relay of the durable consumer with its messages'
// effect in to.
func (b *broker) startRelay(t *testing.T, to sideEffect, concurrency int) *runningRelay {
	t.Helper()
	js := b.connect(t)
	ctx, cancel := context.WithCancel(context.Background())
	lookup, cancelLookup := context.WithTimeout(ctx, 10*time.Second)
	defer cancelLookup()
	cons, err := js.Consumer(lookup, stream, durable)
	require.NoError(t, err)
	r := &runningRelay{
		Relay: &Relay{
			Consumer: cons, Publisher: js, DeadLetterSubject: deadLetterSub,
			Concurrency: concurrency, RetryDelay: 100 * time.Millisecond, MaxRetryDelay: 2 * time.Second,
			Logger: testLogger(t),
		},
		conn: js.Conn(), cancel: cancel, done: make(chan struct{}),
	}
	to.attach(r.Relay)
	runErr := make(chan error, 1)
	go func() {
		defer close(r.done)
		runErr <- r.Run(ctx)
	}()
	t.Cleanup(func() {
		r.stop()
		require.NoError(t, <-runErr)
	})
	return r
}

// publish publishes n order events; msgID, when not nil, names each with a
// Nats-Msg-Id.
func (b *broker) publish(t *testing.T, n int, event func(i int) map[string]any, msgID func(i int) string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 1; i <= n; i++ {
		body, err := json.Marshal(event(i))
		require.NoError(t, err)
		var opts []jetstream.PublishOpt
		if msgID != nil {
			opts = append(opts, jetstream.WithMsgID(msgID(i)))
		}
		_, err = b.js.Publish(ctx, subject, body, opts...)
		require.NoError(t, err)
	}
}

// waitSettled waits until the consumer has every message of the stream
// acked or terminated: nothing pending, nothing awaiting an ack.
func (b *broker) waitSettled(t *testing.T, limit time.Duration) *jetstream.ConsumerInfo {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := b.js.Consumer(ctx, stream, durable)
		var ci *jetstream.ConsumerInfo
		var si *jetstream.StreamInfo
		if err == nil {
			ci, err = info.Info(ctx)
		}
		if err == nil {
			var s jetstream.Stream
			if s, err = b.js.Stream(ctx, stream); err == nil {
				si, err = s.Info(ctx)
			}
		}
		cancel()
		require.NoError(t, err)
		if ci.NumPending == 0 && ci.NumAckPending == 0 && ci.AckFloor.Stream == si.State.LastSeq {
			return ci
		}
		require.True(t, time.Now().Before(deadline),
			"not settled within %v: %d pending, %d awaiting ack, ack floor %d of %d",
			limit, ci.NumPending, ci.NumAckPending, ci.AckFloor.Stream, si.State.LastSeq)
		time.Sleep(50 * time.Millisecond)
	}
}

// deadLetters reads every message of the dead-letter stream.
func (b *broker) deadLetters(t *testing.T) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, stream+"_DLQ")
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	var msgs []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		msgs = append(msgs, m)
	}
	return msgs
}

func paidOrder(i int) map[string]any { return map[string]any{"order": i, "status": "paid"} }

// testLogger logs warnings and errors to the test's log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// testWriter sends the relay's log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// total adds up a figure over several relays.
func total(relays []*runningRelay, figure func(*Stats) int64) int64 {
	var n int64
	for _, r := range relays {
		n += figure(&r.Stats)
	}
	return n
}
