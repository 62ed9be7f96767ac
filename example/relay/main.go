// Command relay consumes a NATS JetStream stream and runs each message's
// side effect once, keyed by the message's identity, although the broker
// delivers at least once. In HTTP mode (the default) it POSTs each message
// to an endpoint protected by the idempotency middleware, with that key as
// its Idempotency-Key:
//
//	go run ./example &                      # the shop, with POST /callbacks/orders
//	go run ./example/relay -publish 20      # 20 demo order events, relayed
//	curl localhost:8080/callbacks/orders    # one execution per event
//
// In-process (-mode inprocess) it runs the side effect itself, through
// idempotency.Do: the shop's order callback, on the Redis of REDIS_URL,
// logging one line per execution:
//
//	go run ./example/relay -mode inprocess -publish 20
//	redis-cli hgetall relay:orders:log      # with REDIS_URL set: one entry per event
//
// With no NATS_URL it runs an embedded JetStream server (data kept in a
// temporary directory until it exits) and says so; in-process with no
// REDIS_URL, an embedded Redis too. Each flag has an environment variable
// of the same meaning (in brackets below); the flag wins. It creates the
// stream and the dead-letter stream when they are missing, and creates or
// updates the durable consumer.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/orderlog"
	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(); err != nil {
		slog.Error("relay: " + err.Error())
		os.Exit(1)
	}
}

type options struct {
	natsURL, stream, subject, durable, target, deadLetter string
	concurrency, publish                                  int
	ackWait                                               time.Duration
	mode                                                  string
	// In-process mode only.
	redisURL, effects string
	work              time.Duration
}

// The modes: where a message's side effect runs.
const (
	modeHTTP      = "http"
	modeInProcess = "inprocess"
)

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	fs.StringVar(&o.mode, "mode", envOr("RELAY_MODE", modeHTTP),
		"where the side effect runs [RELAY_MODE]: http POSTs each message to -target; inprocess runs it here, through idempotency.Do")
	fs.StringVar(&o.natsURL, "nats", os.Getenv("NATS_URL"), "NATS server URL [NATS_URL]; empty runs an embedded server")
	fs.StringVar(&o.stream, "stream", envOr("RELAY_STREAM", "ORDERS"), "stream to consume [RELAY_STREAM]")
	fs.StringVar(&o.subject, "subject", envOr("RELAY_SUBJECT", "orders.events"), "subject the consumer filters on [RELAY_SUBJECT]")
	fs.StringVar(&o.durable, "durable", envOr("RELAY_DURABLE", "callbacks"), "durable consumer name [RELAY_DURABLE]")
	fs.StringVar(&o.target, "target", envOr("RELAY_TARGET", "http://localhost:8080/callbacks/orders"), "URL each message is POSTed to [RELAY_TARGET]")
	fs.StringVar(&o.deadLetter, "dead-letter", os.Getenv("RELAY_DEAD_LETTER"), "dead-letter subject [RELAY_DEAD_LETTER]; default dlq.<subject>")
	concurrency, err := strconv.Atoi(envOr("RELAY_CONCURRENCY", "8"))
	if err != nil {
		return o, fmt.Errorf("RELAY_CONCURRENCY: %w", err)
	}
	fs.IntVar(&o.concurrency, "concurrency", concurrency, "messages in flight at once [RELAY_CONCURRENCY]")
	ackWait, err := time.ParseDuration(envOr("RELAY_ACK_WAIT", "30s"))
	if err != nil {
		return o, fmt.Errorf("RELAY_ACK_WAIT: %w", err)
	}
	fs.DurationVar(&o.ackWait, "ack-wait", ackWait, "consumer AckWait: redelivery after a silent relay [RELAY_ACK_WAIT]")
	fs.StringVar(&o.redisURL, "redis", os.Getenv("REDIS_URL"), "inprocess: Redis URL of the idempotency records and the order log [REDIS_URL]; empty runs an embedded one")
	fs.StringVar(&o.effects, "effects", envOr("RELAY_EFFECTS", "relay:orders:log"), "inprocess: the order log's Redis hash, one entry per event ([RELAY_EFFECTS]:reruns holds the executions past the first) [RELAY_EFFECTS]")
	work, err := time.ParseDuration(envOr("RELAY_WORK", "10ms"))
	if err != nil {
		return o, fmt.Errorf("RELAY_WORK: %w", err)
	}
	fs.DurationVar(&o.work, "work", work, "inprocess: simulated work of every event; an event's work_ms adds to it [RELAY_WORK]")
	fs.IntVar(&o.publish, "publish", 0, "publish this many demo order events first")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.mode != modeHTTP && o.mode != modeInProcess {
		return o, fmt.Errorf("mode %q: want %s or %s", o.mode, modeHTTP, modeInProcess)
	}
	if o.deadLetter == "" {
		o.deadLetter = "dlq." + o.subject
	}
	if o.concurrency < 1 {
		return o, errors.New("concurrency must be at least 1")
	}
	return o, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run() error {
	o, err := parseOptions(os.Args[1:])
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if o.natsURL == "" {
		dir, err := os.MkdirTemp("", "relay-jetstream-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		ns, err := startEmbeddedNATS(dir)
		if err != nil {
			return err
		}
		defer ns.WaitForShutdown()
		defer ns.Shutdown()
		o.natsURL = ns.ClientURL()
		slog.Warn("relay: NATS_URL is not set; using an embedded JetStream server. "+
			"Its streams are lost on exit.", "url", o.natsURL)
	}
	nc, err := nats.Connect(o.natsURL, nats.Name("idempotency-relay"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := setUp(ctx, js, o)
	if err != nil {
		return err
	}
	if err := publishDemo(ctx, js, o.subject, o.publish); err != nil {
		return err
	}
	r := &Relay{Consumer: cons, Publisher: js, DeadLetterSubject: o.deadLetter, Concurrency: o.concurrency}
	sideEffect := []any{"target", o.target}
	if o.mode == modeHTTP {
		r.Target = o.target
	} else {
		rdb, closeRedis, err := connectRedis(o.redisURL)
		if err != nil {
			return err
		}
		defer closeRedis()
		// WithRetryAbandoned, as the shop's callbacks: an execution that
		// vanished, or a claim Redis applied after an outage made the
		// middleware give up, would otherwise dead-letter its message.
		// The order log's fenced state makes the takeover safe.
		r.Middleware = idempotency.New(rdb, idempotency.WithRetryAbandoned())
		orders := &orderProcess{log: orderlog.New(rdb, o.effects, "pid-"+strconv.Itoa(os.Getpid())), work: o.work, logger: slog.Default()}
		r.Process = orders.process
		sideEffect = []any{"effects", o.effects}
	}
	slog.Info("relay: relaying", append([]any{"mode", o.mode, "stream", o.stream, "subject", o.subject,
		"consumer", o.durable, "dead_letter", o.deadLetter, "concurrency", o.concurrency}, sideEffect...)...)
	return r.Run(ctx)
}

// connectRedis connects to the Redis at url, or starts an embedded one when
// url is empty so that the in-process mode needs no set-up.
func connectRedis(url string) (redis.UniversalClient, func(), error) {
	var opts *redis.Options
	closeEmbedded := func() {}
	if url != "" {
		var err error
		if opts, err = redis.ParseURL(url); err != nil {
			return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
		}
	} else {
		mr, err := miniredis.Run()
		if err != nil {
			return nil, nil, err
		}
		closeEmbedded = mr.Close
		opts = &redis.Options{Addr: mr.Addr()}
		slog.Warn("relay: REDIS_URL is not set; using an embedded in-process Redis (miniredis). " +
			"Its data is lost on exit and no other relay can share it.")
	}
	// Let the middleware's store timeout cut a stalled Redis short.
	opts.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		closeEmbedded()
		return nil, nil, fmt.Errorf("redis: %w", err)
	}
	return rdb, func() { rdb.Close(); closeEmbedded() }, nil
}

// setUp creates the stream and the dead-letter stream when they are
// missing (an existing stream is left as it is) and the durable consumer.
func setUp(ctx context.Context, js jetstream.JetStream, o options) (jetstream.Consumer, error) {
	streams := []jetstream.StreamConfig{
		{Name: o.stream, Subjects: []string{o.subject}},
		{Name: o.stream + "_DLQ", Subjects: []string{o.deadLetter}},
	}
	for _, cfg := range streams {
		if _, err := js.Stream(ctx, cfg.Name); errors.Is(err, jetstream.ErrStreamNotFound) {
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				return nil, fmt.Errorf("creating stream %s: %w", cfg.Name, err)
			}
		} else if err != nil {
			return nil, err
		}
	}
	return js.CreateOrUpdateConsumer(ctx, o.stream, consumerConfig(o.durable, o.subject, o.ackWait))
}

// consumerConfig is the relay's durable pull consumer: explicit acks, and
// redelivery without a limit, since every answer that cannot succeed is
// dead-lettered by the relay itself.
func consumerConfig(durable, subject string, ackWait time.Duration) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       durable,
		FilterSubject: subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
	}
}

// publishDemo publishes n order events, each with a Nats-Msg-Id.
func publishDemo(ctx context.Context, js jetstream.JetStream, subject string, n int) error {
	run := time.Now().UnixNano()
	for i := 1; i <= n; i++ {
		body, _ := json.Marshal(map[string]any{"order": i, "status": "paid"})
		id := fmt.Sprintf("demo-%d-%d", run, i)
		if _, err := js.Publish(ctx, subject, body, jetstream.WithMsgID(id)); err != nil {
			return fmt.Errorf("publishing demo event %d: %w", i, err)
		}
	}
	if n > 0 {
		slog.Info("relay: published demo order events", "count", n, "subject", subject)
	}
	return nil
}
