package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/onceonly/idempotency"
	"github.com/onceonly/idempotency/cloudevents"
	"github.com/onceonly/idempotency/example/internal/orderlog"
	"github.com/onceonly/idempotency/example/internal/reply"
	"github.com/onceonly/idempotency/optimistic"
)

// Order-event callbacks: endpoints that a message relay (example/relay) or
// a CloudEvents sender calls at least once per event, and sometimes more.
//
// Each execution records the event in the order log (internal/orderlog):
// its state, written with the execution's fencing token, and its entry,
// written once per event, with every execution past the first counted as a
// rerun. GET /callbacks/orders shows both, so any duplicate run the
// middleware let through shows there.
//
// The routes take abandoned keys over (WithRetryAbandoned): a queue
// redelivers until someone answers, and without takeover a key whose claim
// outlived its instance, or whose claim Redis applied after the
// middleware had given up on it during an outage, would answer 409
// interrupted for as long as its record lives. The fence is what makes the
// takeover safe: an executor that lost its key cannot write the state after
// the execution that took it over.

// callbacksLog names the order log of the callbacks in Redis, and
// callbacksTables its tables in SQL.
const (
	callbacksLog    = "shop:callbacks:log"
	callbacksTables = "shop_callbacks"
)

// RerunsHeader carries, on GET /callbacks/orders, how many executions
// found their event recorded already.
const RerunsHeader = "Callback-Reruns"

type callbacks struct {
	log     *orderlog.Log
	latency time.Duration
}

// registerCallbacks mounts the order callbacks on r:
//
//	POST /callbacks/orders              key mode: Idempotency-Key, as the relay sends it
//	POST /callbacks/cloudevents/orders  a CloudEvent, binary or structured, keyed by its id within its source
//	GET  /callbacks/orders              each event's entry, and the reruns in Callback-Reruns
//
// latency is the simulated work of every callback (CALLBACK_LATENCY).
func registerCallbacks(r chi.Router, back backend, latency time.Duration) ([]*idempotency.Middleware, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	log, err := back.orderLog(ctx, callbacksLog, callbacksTables)
	if err != nil {
		return nil, err
	}
	cb := &callbacks{log: log, latency: latency}
	byKey := back.protection(idempotency.WithCallerCredentials(), idempotency.WithRetryAbandoned())
	byEvent := back.protection(idempotency.WithRetryAbandoned(),
		idempotency.WithKeyExtractor(cloudevents.Key),
		idempotency.WithScope(cloudevents.Scope),
		idempotency.WithFingerprint(cloudevents.Fingerprint))
	r.With(byKey.ProtectKey).Post("/callbacks/orders", cb.handle(relayedEvent))
	r.With(byEvent.ProtectKey).Post("/callbacks/cloudevents/orders", cb.handle(cloudEvent))
	r.Get("/callbacks/orders", cb.list)
	return []*idempotency.Middleware{byKey, byEvent}, nil
}

// An eventDecoder finds the key a callback was protected by and its order
// event.
type eventDecoder func(r *http.Request) (key string, ev orderlog.Event, err error)

// relayedEvent reads a relay's callback: the body is the event, the key
// the Idempotency-Key header.
func relayedEvent(r *http.Request) (string, orderlog.Event, error) {
	var ev orderlog.Event
	err := json.NewDecoder(r.Body).Decode(&ev)
	return r.Header.Get(idempotency.KeyHeader), ev, err
}

// cloudEvent reads a CloudEvent: in structured mode the order is the
// event's data, in binary mode the whole body.
func cloudEvent(r *http.Request) (string, orderlog.Event, error) {
	var envelope struct {
		ID   string         `json:"id"`
		Data orderlog.Event `json:"data"`
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
		if err != nil || !ev.Valid() {
			// Nothing ran: the key goes back, for a corrected event.
			idempotency.Release(r.Context())
			reply.Problem(w, http.StatusBadRequest, "invalid-event",
				"body must be an order event: a JSON object with a positive order, and a status of up to 64 bytes of printable text")
			return
		}
		if err := sleep(r.Context(), ev.Work(cb.latency)); err != nil {
			// The middleware cut this execution off before its effect: say
			// so, retryably. (A silent return would be a 200 the sender
			// acknowledges, with nothing done.) The key is kept, and the
			// retry takes it over.
			w.Header().Set("Retry-After", "1")
			reply.Problem(w, http.StatusServiceUnavailable, "interrupted", "the callback was interrupted; retry it")
			return
		}
		entry, _, err := cb.log.Record(r.Context(), key, ev)
		if errors.Is(err, optimistic.ErrStaleFence) {
			// Another execution took this key over while we were stalled.
			// Its answer is the one stored: a retry gets it replayed.
			w.Header().Set("Retry-After", "1")
			reply.Problem(w, http.StatusConflict, "superseded", "this event was handled by another attempt")
			return
		}
		if err != nil {
			// Stored and replayed like any answer (a retry does not run the
			// handler again): a write may have landed before the error.
			slog.Error("example: callback failed", "key", key, "error", err)
			reply.Problem(w, http.StatusInternalServerError, "internal", "the callback could not be recorded")
			return
		}
		reply.JSON(w, http.StatusOK, entry)
	}
}

// list answers every event's entry, in the order they were handled, and
// the count of reruns in RerunsHeader.
func (cb *callbacks) list(w http.ResponseWriter, r *http.Request) {
	effects, err := cb.log.Effects(r.Context())
	if errors.Is(err, orderlog.ErrCorruptEntry) {
		reply.Problem(w, http.StatusInternalServerError, "internal", "a callback entry is corrupt")
		return
	}
	if err != nil {
		reply.Problem(w, http.StatusServiceUnavailable, "store-unavailable", "the callbacks could not be read")
		return
	}
	reruns, err := cb.log.Reruns(r.Context())
	if err != nil {
		reply.Problem(w, http.StatusServiceUnavailable, "store-unavailable", "the callbacks could not be read")
		return
	}
	w.Header().Set(RerunsHeader, strconv.FormatInt(reruns, 10))
	reply.JSON(w, http.StatusOK, effects)
}
