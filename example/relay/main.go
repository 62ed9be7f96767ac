// Command relay consumes a NATS JetStream stream and POSTs each message to
// an endpoint protected by the idempotency middleware, with the message's
// identity as its Idempotency-Key, so that the broker's at-least-once
// delivery runs the endpoint's side effect once:
//
//	go run ./example &                      # the shop, with POST /callbacks/orders
//	go run ./example/relay -publish 20      # 20 demo order events, relayed
//	curl localhost:8080/callbacks/orders    # one execution per event
//
// With no NATS_URL it runs an embedded JetStream server (data kept in a
// temporary directory until it exits) and says so. Each flag has an
// environment variable of the same meaning (in brackets below); the flag
// wins. It creates the stream and the dead-letter stream when they are
// missing, and creates or updates the durable consumer.
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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
}

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
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
	fs.IntVar(&o.publish, "publish", 0, "publish this many demo order events first")
	if err := fs.Parse(args); err != nil {
		return o, err
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
	slog.Info("relay: relaying", "stream", o.stream, "subject", o.subject, "consumer", o.durable,
		"target", o.target, "dead_letter", o.deadLetter, "concurrency", o.concurrency)
	r := &Relay{Consumer: cons, Publisher: js, Target: o.target, DeadLetterSubject: o.deadLetter, Concurrency: o.concurrency}
	return r.Run(ctx)
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
