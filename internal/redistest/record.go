package redistest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/redis/go-redis/v9"
)

// ReadRecord reads the record named key; a missing one reads as a Record
// with no State.
func ReadRecord(ctx context.Context, c redis.Cmdable, key string) (keyspace.Record, error) {
	text, err := c.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return keyspace.Record{}, nil
	}
	if err != nil {
		return keyspace.Record{}, err
	}
	r, ok := keyspace.ParseRecord(text)
	if !ok {
		return keyspace.Record{}, fmt.Errorf("redistest: %s holds no record: %q", key, text)
	}
	return r, nil
}

// RecordState is the state of the record named key, "" when there is none.
func RecordState(ctx context.Context, c redis.Cmdable, key string) string {
	r, _ := ReadRecord(ctx, c, key)
	return r.State
}

// EditRecord rewrites the record named key with edit, keeping its TTL.
func EditRecord(ctx context.Context, c redis.Cmdable, key string, edit func(*keyspace.Record)) error {
	r, err := ReadRecord(ctx, c, key)
	if err != nil {
		return err
	}
	if r.State == "" {
		return fmt.Errorf("redistest: %s holds no record", key)
	}
	edit(&r)
	return c.SetArgs(ctx, key, r.String(), redis.SetArgs{KeepTTL: true}).Err()
}

// Abandon makes the record named key look abandoned: claimed an hour ago
// under a lock value that nobody holds, with no answer stored.
func Abandon(ctx context.Context, c redis.Cmdable, key string) error {
	return EditRecord(ctx, c, key, func(r *keyspace.Record) {
		r.State, r.Owner = "run", "an-executor-that-died"
		r.Status, r.Header, r.Body = "", "", ""
		r.Fence = aged(r.Fence, time.Hour)
	})
}

// Age makes the claim of the record named key look d older: its fence is
// Redis's clock at the claim, in microseconds. A claim whose lock lapsed
// reads interrupted only once its executor could no longer store, a while
// after its claim; a test that stands for that while ages the claim.
func Age(ctx context.Context, c redis.Cmdable, key string, d time.Duration) error {
	return EditRecord(ctx, c, key, func(r *keyspace.Record) { r.Fence = aged(r.Fence, d) })
}

func aged(fence string, d time.Duration) string {
	f, err := strconv.ParseInt(fence, 10, 64)
	if err != nil || f <= d.Microseconds() {
		return fence
	}
	return strconv.FormatInt(f-d.Microseconds(), 10)
}
