package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/onceonly/idempotency/optimistic"
	"github.com/redis/go-redis/v9"
)

// Order is what POST /orders creates.
type Order struct {
	ID        int64     `json:"id"`
	Item      string    `json:"item"`
	Quantity  int       `json:"quantity"`
	Status    string    `json:"status"`
	Version   int64     `json:"version"`
	CreatedAt time.Time `json:"created_at"`
}

// Payment is what POST /payments creates.
type Payment struct {
	ID        string    `json:"id"`
	Charge    string    `json:"charge"` // the provider's charge id
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

// shopStore is where the shop keeps its orders and payments, so that
// every instance pointed at one store is one shop: Redis (redisShop), or
// the SQL database of IDEMPOTENCY_STORE (sqlShop). Orders are guarded by a
// version (status changes are compare-and-set), payments by the fencing
// token of the request that captured them.
type shopStore interface {
	// addOrder gives o the next order id and stores it at version 1.
	addOrder(ctx context.Context, o *Order) error
	// cancelOrder moves a placed order to cancelled, re-reading and
	// retrying when another request changed it in between: errNoOrder for
	// a missing order, errNotCancelable for one not placed.
	cancelOrder(ctx context.Context, id int64) (Order, error)
	// order reads one order; errNoOrder when there is none.
	order(ctx context.Context, id int64) (Order, error)
	// orders lists every order, by id.
	orders(ctx context.Context) ([]Order, error)
	// capturePayment records p as captured under the execution's fencing
	// token, creating it or writing over an earlier execution's; a fence
	// below the one that wrote it last is refused with
	// optimistic.ErrStaleFence, and nothing is written.
	capturePayment(ctx context.Context, p *Payment, fence uint64) error
	// payments lists every payment, in the order they were captured.
	payments(ctx context.Context) ([]Payment, error)
	// ping is answered once the store answers.
	ping(ctx context.Context) error
}

// redisShop keeps orders and payments in Redis under "shop:". Each order
// and payment is a hash of its own, guarded by the optimistic helpers, and
// sorted sets index them for listing.
type redisShop struct {
	rdb  redis.UniversalClient
	hash optimistic.Hash
}

const (
	ordersIndex   = "shop:orders"
	ordersSeq     = "shop:orders:seq"
	paymentsIndex = "shop:payments"
)

func orderKey(id int64) string    { return "shop:order:" + strconv.FormatInt(id, 10) }
func paymentKey(id string) string { return "shop:payment:" + id }

var (
	errNoOrder       = errors.New("no such order")
	errNotCancelable = errors.New("order is not placed")
)

// addOrder creates an order at version 1: a compare-and-set from version 0
// cannot overwrite anything.
func (s redisShop) addOrder(ctx context.Context, o *Order) error {
	id, err := s.rdb.Incr(ctx, ordersSeq).Result()
	if err != nil {
		return err
	}
	o.ID = id
	o.Version, err = s.hash.CompareAndSet(ctx, s.rdb, orderKey(id), 0, map[string]any{
		"item": o.Item, "quantity": o.Quantity, "status": o.Status,
		"created_at": o.CreatedAt.Format(time.RFC3339Nano),
	})
	if err != nil {
		return err
	}
	return s.rdb.ZAdd(ctx, ordersIndex, redis.Z{Score: float64(id), Member: id}).Err()
}

func (s redisShop) cancelOrder(ctx context.Context, id int64) (Order, error) {
	var o Order
	err := optimistic.Retry(ctx, optimistic.Policy{}, func(ctx context.Context) error {
		fields, version, err := s.hash.Read(ctx, s.rdb, orderKey(id))
		if err != nil {
			return err
		}
		if version == 0 {
			return errNoOrder
		}
		o = orderFrom(id, fields, version)
		if o.Status != "placed" {
			return errNotCancelable
		}
		o.Version, err = s.hash.CompareAndSet(ctx, s.rdb, orderKey(id), version, map[string]any{"status": "cancelled"})
		o.Status = "cancelled"
		return err
	})
	return o, err
}

func (s redisShop) order(ctx context.Context, id int64) (Order, error) {
	fields, version, err := s.hash.Read(ctx, s.rdb, orderKey(id))
	if err != nil {
		return Order{}, err
	}
	if version == 0 {
		return Order{}, errNoOrder
	}
	return orderFrom(id, fields, version), nil
}

func orderFrom(id int64, f map[string]string, version int64) Order {
	quantity, _ := strconv.Atoi(f["quantity"])
	created, _ := time.Parse(time.RFC3339Nano, f["created_at"])
	return Order{ID: id, Item: f["item"], Quantity: quantity, Status: f["status"], Version: version, CreatedAt: created}
}

// orders lists every order. An index entry whose order is gone is left
// out rather than failing the whole listing.
func (s redisShop) orders(ctx context.Context) ([]Order, error) {
	ids, err := s.rdb.ZRange(ctx, ordersIndex, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(ids))
	numbers := make([]int64, len(ids))
	for i, raw := range ids {
		numbers[i], _ = strconv.ParseInt(raw, 10, 64)
		keys[i] = orderKey(numbers[i])
	}
	read, err := s.hashes(ctx, keys)
	if err != nil {
		return nil, err
	}
	out := make([]Order, 0, len(ids))
	for i, key := range keys {
		fields, version, err := s.hash.Read(ctx, read, key)
		if err != nil {
			return nil, err
		}
		if version > 0 {
			out = append(out, orderFrom(numbers[i], fields, version))
		}
	}
	return out, nil
}

// listBatch is how many hashes one round trip reads for a listing: tens of
// thousands of orders cost tens of round trips, not one per order.
const listBatch = 1000

// hashes reads the hashes at keys, listBatch of them per pipeline (which a
// Redis Cluster client splits by node).
func (s redisShop) hashes(ctx context.Context, keys []string) (fetched, error) {
	read := make(fetched, len(keys))
	for batch := range slices.Chunk(keys, listBatch) {
		pipe := s.rdb.Pipeline()
		for _, key := range batch {
			read[key] = pipe.HGetAll(ctx, key)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, err
		}
	}
	return read, nil
}

// fetched holds hashes that a pipeline read. It is an optimistic.HashReader
// over them, so that Hash.Read parses a listing's orders as it parses one.
type fetched map[string]*redis.MapStringStringCmd

func (f fetched) HGetAll(_ context.Context, key string) *redis.MapStringStringCmd { return f[key] }

// paymentID names the payment a client's idempotency key pays for: the
// payment belongs to the key, so an execution that takes an abandoned key
// over writes the same payment, and its fence refuses the stale one's write.
func paymentID(key string) string { return keyDigest(key) }

// keyDigest names what belongs to an idempotency key in a Redis key: 64 bits
// of its SHA-256 in hex, whatever bytes the key holds.
func keyDigest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

func (s redisShop) capturePayment(ctx context.Context, p *Payment, fence uint64) error {
	err := s.hash.FencedSet(ctx, s.rdb, paymentKey(p.ID), fence, map[string]any{
		"charge": p.Charge, "amount": p.Amount, "currency": p.Currency, "status": p.Status,
		"created_at": p.CreatedAt.Format(time.RFC3339Nano),
	})
	if err != nil {
		return err
	}
	return s.rdb.ZAdd(ctx, paymentsIndex, redis.Z{Score: float64(p.CreatedAt.UnixNano()), Member: p.ID}).Err()
}

func (s redisShop) ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

func (s redisShop) payments(ctx context.Context) ([]Payment, error) {
	ids, err := s.rdb.ZRange(ctx, paymentsIndex, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = paymentKey(id)
	}
	read, err := s.hashes(ctx, keys)
	if err != nil {
		return nil, err
	}
	out := make([]Payment, 0, len(ids))
	for i, id := range ids {
		f := read[keys[i]].Val()
		amount, _ := strconv.ParseInt(f["amount"], 10, 64)
		created, _ := time.Parse(time.RFC3339Nano, f["created_at"])
		out = append(out, Payment{ID: id, Charge: f["charge"], Amount: amount, Currency: f["currency"], Status: f["status"],
			CreatedAt: created})
	}
	return out, nil
}
