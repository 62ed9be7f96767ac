package main

import (
	"context"
	"encoding/json"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Order is what POST /orders creates.
type Order struct {
	ID        int64     `json:"id"`
	Item      string    `json:"item"`
	Quantity  int       `json:"quantity"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

// Payment is what POST /payments creates.
type Payment struct {
	ID        int64     `json:"id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

// shopStore keeps orders and payments in Redis under "shop:", so every
// instance pointed at one Redis is one shop. Each collection is one hash
// with its own hash tag, which keeps it listable on a cluster.
type shopStore struct {
	rdb redis.UniversalClient
}

const (
	ordersKey   = "shop:{orders}"
	paymentsKey = "shop:{payments}"
)

// add stores v under a new id from the collection's sequence.
func (s shopStore) add(ctx context.Context, collection string, v interface{ setID(int64) }) error {
	id, err := s.rdb.HIncrBy(ctx, collection+":seq", "next", 1).Result()
	if err != nil {
		return err
	}
	v.setID(id)
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.rdb.HSet(ctx, collection, strconv.FormatInt(id, 10), data).Err()
}

func (o *Order) setID(id int64)   { o.ID = id }
func (p *Payment) setID(id int64) { p.ID = id }

func list[T any](ctx context.Context, s shopStore, collection string, id func(T) int64) ([]T, error) {
	all, err := s.rdb.HGetAll(ctx, collection).Result()
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(all))
	for _, data := range all {
		var v T
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return id(out[i]) < id(out[j]) })
	return out, nil
}

func (s shopStore) orders(ctx context.Context) ([]Order, error) {
	return list(ctx, s, ordersKey, func(o Order) int64 { return o.ID })
}

func (s shopStore) payments(ctx context.Context) ([]Payment, error) {
	return list(ctx, s, paymentsKey, func(p Payment) int64 { return p.ID })
}

// order returns one order, or redis.Nil.
func (s shopStore) order(ctx context.Context, id int64) (Order, error) {
	var o Order
	data, err := s.rdb.HGet(ctx, ordersKey, strconv.FormatInt(id, 10)).Bytes()
	if err != nil {
		return o, err
	}
	return o, json.Unmarshal(data, &o)
}
