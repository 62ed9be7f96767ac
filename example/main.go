// Command example runs a small shop whose order and payment endpoints are
// protected by the idempotency middleware.
//
//	go run ./example
//
// With no REDIS_URL it runs on an embedded in-process Redis; REDIS_URL
// (redis://host:port/0) selects a real one and REDIS_CLUSTER_ADDRS
// (host:port,host:port,…) a Redis Cluster. ADDR (default :8080) is where it
// listens, ORDER_LATENCY (default 0) and PAYMENT_LATENCY (default 300ms) how
// slow its back ends are.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(); err != nil {
		slog.Error("example: " + err.Error())
		os.Exit(1)
	}
}

func run() error {
	cfg, err := configFromEnv()
	if err != nil {
		return err
	}
	rdb, closeRedis, err := connect()
	if err != nil {
		return err
	}
	defer closeRedis()

	srv := &http.Server{Addr: cfg.addr, Handler: newApp(rdb, cfg), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(shutdown) // protected handlers finish and store their answers
	}()
	slog.Info("example: shop listening", "addr", cfg.addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type config struct {
	addr            string
	orderLatency    time.Duration
	paymentLatency  time.Duration
	callbackLatency time.Duration
}

func configFromEnv() (config, error) {
	cfg := config{addr: ":8080", paymentLatency: 300 * time.Millisecond, callbackLatency: 10 * time.Millisecond}
	if v := os.Getenv("ADDR"); v != "" {
		cfg.addr = v
	}
	for name, dst := range map[string]*time.Duration{
		"ORDER_LATENCY": &cfg.orderLatency, "PAYMENT_LATENCY": &cfg.paymentLatency,
		"CALLBACK_LATENCY": &cfg.callbackLatency,
	} {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return cfg, fmt.Errorf("%s=%q is not a duration such as 250ms", name, v)
			}
			*dst = d
		}
	}
	return cfg, nil
}

// connect picks the Redis named by the environment, or starts an embedded
// one so that the example needs no set-up.
func connect() (redis.UniversalClient, func(), error) {
	if addrs := os.Getenv("REDIS_CLUSTER_ADDRS"); addrs != "" {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: strings.Split(addrs, ","), ContextTimeoutEnabled: true,
		})
		slog.Info("example: using Redis Cluster", "addrs", addrs)
		return rdb, func() { rdb.Close() }, ping(rdb)
	}
	if url := os.Getenv("REDIS_URL"); url != "" {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		// Let the middleware's store timeout cut a stalled Redis short.
		opts.ContextTimeoutEnabled = true
		rdb := redis.NewClient(opts)
		slog.Info("example: using Redis", "addr", opts.Addr)
		return rdb, func() { rdb.Close() }, ping(rdb)
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, nil, err
	}
	slog.Warn("example: REDIS_URL is not set; using an embedded in-process Redis (miniredis). " +
		"Its data is lost on exit and it cannot be shared by several instances.")
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	return rdb, func() { rdb.Close(); mr.Close() }, nil
}

func ping(rdb redis.UniversalClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}
