package main

import (
	"encoding/json"
	"errors"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/example/internal/reply"
	"github.com/onceonly/idempotency/optimistic"
	"github.com/redis/go-redis/v9"
)

// Order-event callbacks: endpoints that a message relay (example/relay) or
// a CloudEvents sender calls at least once per event, and sometimes more.
//
// Each execution records the event's state in a hash of its own, written
// with the execution's fencing token, and appends one entry to a log of
// executions. The log is not idempotent by itself, so every duplicate run
// the middleware let through would show in GET /callbacks/orders.
//
// The routes take abandoned keys over (WithRetryAbandoned): a queue
// redelivers until someone answers, and without takeover a key whose claim
// outlived its instance, or whose claim Redis applied after the
// middleware had given up on it during an outage, would answer 409
// interrupted for as long as its record lives. The fence is what makes the
// takeover safe: an executor that lost its key cannot write the state after
// the execution that took it over.

const (
	// maxEventWork caps the extra work an event may ask for (work_ms), so a
	// demo event cannot hold a handler for long.
	maxEventWork = 10 * time.Second
	callbacksKey = "shop:callbacks:orders"
)

// callbackStateKey names the hash that holds an event's state, after its
// idempotency key.
func callbackStateKey(key string) string { return "shop:callback:" + keyDigest(key) }

// OrderEvent is what an order callback carries: the body the relay posts,
// or the data of a CloudEvent.
type OrderEvent struct {
	Order  int64  `json:"order"`
	Status string `json:"status"`
	// WorkMS adds simulated work to this one event (at most 10 s), to show
	// what a slow handler does to a broker's redelivery.
	WorkMS int `json:"work_ms,omitempty"`
}

// CallbackEffect is one execution of a callback: the side effect that must
// happen once per event.
type CallbackEffect struct {
	Key       string    `json:"key"`
	Order     int64     `json:"order"`
	Status    string    `json:"status"`
	Fence     uint64    `json:"fence"`
	Instance  string    `json:"instance"`
	HandledAt time.Time `json:"handled_at"`
}

type callbacks struct {
	rdb      redis.UniversalClient
	hash     optimistic.Hash
	latency  time.Duration
	instance string
}

// registerCallbacks mounts the order callbacks on r:
//
//	POST /callbacks/orders              key mode: Idempotency-Key, as the relay sends it
//	POST /callbacks/cloudevents/orders  a CloudEvent, binary or structured, keyed by its id within its source
//	GET  /callbacks/orders              every execution so far
//
// latency is the simulated work of every callback (CALLBACK_LATENCY).
func registerCallbacks(r chi.Router, rdb redis.UniversalClient, latency time.Duration) {
	cb := &callbacks{rdb: rdb, latency: latency, instance: "pid-" + strconv.Itoa(os.Getpid())}
	byKey := idempotency.New(rdb, idempotency.WithRetryAbandoned())
	byEvent := idempotency.New(rdb, idempotency.WithRetryAbandoned(),
		idempotency.WithKeyExtractor(idempotency.CloudEventKey),
		idempotency.WithScope(idempotency.CloudEventScope))
	r.With(byKey.ProtectKey).Post("/callbacks/orders", cb.handle(relayedEvent))
	r.With(byEvent.ProtectKey).Post("/callbacks/cloudevents/orders", cb.handle(cloudEvent))
	r.Get("/callbacks/orders", cb.list)
}

// An eventDecoder finds the key a callback was protected by and its order
// event.
type eventDecoder func(r *http.Request) (key string, ev OrderEvent, err error)

// relayedEvent reads a relay's callback: the body is the event, the key
// the Idempotency-Key header.
func relayedEvent(r *http.Request) (string, OrderEvent, error) {
	var ev OrderEvent
	err := json.NewDecoder(r.Body).Decode(&ev)
	return r.Header.Get(idempotency.KeyHeader), ev, err
}

// cloudEvent reads a CloudEvent: in structured mode the order is the
// event's data, in binary mode the whole body.
func cloudEvent(r *http.Request) (string, OrderEvent, error) {
	var envelope struct {
		ID   string     `json:"id"`
		Data OrderEvent `json:"data"`
	}
	if mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mediaType == "application/cloudevents+json" {
		err := json.NewDecoder(r.Body).Decode(&envelope)
		return envelope.ID, envelope.Data, err
	}
	err := json.NewDecoder(r.Body).Decode(&envelope.Data)
	return r.Header.Get("Ce-Id"), envelope.Data, err
}

func (cb *callbacks) handle(decode eventDecoder) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, ev, err := decode(r)
		if err != nil || ev.Order <= 0 {
			reply.Problem(w, http.StatusBadRequest, "invalid-event",
				"body must be an order event: a JSON object with a positive order")
			return
		}
		work := cb.latency + min(time.Duration(ev.WorkMS)*time.Millisecond, maxEventWork)
		if err := sleep(r.Context(), work); err != nil {
			return
		}
		effect := CallbackEffect{
			Key: key, Order: ev.Order, Status: ev.Status, Fence: idempotency.FencingToken(r.Context()),
			Instance: cb.instance, HandledAt: time.Now().UTC(),
		}
		err = cb.hash.FencedSet(r.Context(), cb.rdb, callbackStateKey(key), effect.Fence, map[string]any{
			"order": effect.Order, "status": effect.Status, "instance": effect.Instance,
			"handled_at": effect.HandledAt.Format(time.RFC3339Nano),
		})
		if errors.Is(err, optimistic.ErrStaleFence) {
			// Another execution took this key over while we were stalled.
			// Its answer is the one stored: a retry gets it replayed.
			w.Header().Set("Retry-After", "1")
			reply.Problem(w, http.StatusConflict, "superseded", "this event was handled by another attempt")
			return
		}
		if err == nil {
			entry, _ := json.Marshal(effect)
			err = cb.rdb.RPush(r.Context(), callbacksKey, entry).Err()
		}
		if err != nil {
			// Stored and replayed like any answer (a retry does not run the
			// handler again): a write may have landed before the error.
			slog.Error("example: callback failed", "key", key, "error", err)
			reply.Problem(w, http.StatusInternalServerError, "internal", "the callback could not be recorded")
			return
		}
		reply.JSON(w, http.StatusOK, effect)
	}
}

func (cb *callbacks) list(w http.ResponseWriter, r *http.Request) {
	entries, err := cb.rdb.LRange(r.Context(), callbacksKey, 0, -1).Result()
	if err != nil {
		reply.Problem(w, http.StatusServiceUnavailable, "store-unavailable", "the callbacks could not be read")
		return
	}
	effects := make([]CallbackEffect, 0, len(entries))
	for _, e := range entries {
		var effect CallbackEffect
		if err := json.Unmarshal([]byte(e), &effect); err != nil {
			reply.Problem(w, http.StatusInternalServerError, "internal", "a callback entry is corrupt")
			return
		}
		effects = append(effects, effect)
	}
	reply.JSON(w, http.StatusOK, effects)
}
