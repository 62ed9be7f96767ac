package idempotency_test

import (
	"context"
	"fmt"

	"github.com/onceonly/idempotency"
	"github.com/redis/go-redis/v9"
)

// A queue consumer: the broker delivers a message twice (its ack was lost),
// and the charge runs once. The message id is the key, its body the input.
func ExampleDo() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // "localhost:6379" in your program
		ContextTimeoutEnabled: true,
	})
	defer rdb.Close()
	idem := idempotency.New(rdb, idempotency.WithKeyPrefix("example:do"))

	type receipt struct {
		Charge int
		Amount int
	}
	charges := 0
	handle := func(ctx context.Context, id string, body []byte) (receipt, error) {
		key := idempotency.Key{Scope: "orders-queue", ID: id, Input: body}
		return idempotency.Do(ctx, idem, key, func(ctx context.Context) (receipt, error) {
			charges++ // the side effect, once per message
			return receipt{Charge: charges, Amount: 500}, nil
		})
	}
	for range 2 {
		r, err := handle(context.Background(), "msg-81", []byte(`{"amount":500}`))
		fmt.Println(r, err)
	}
	_, err := handle(context.Background(), "msg-81", []byte(`{"amount":900}`))
	fmt.Println(err)
	// Output:
	// {1 500} <nil>
	// {1 500} <nil>
	// idempotency: key reused for a different request
}
