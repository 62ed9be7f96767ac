package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/onceonly/idempotency"
)

// Relay hands the messages of a JetStream pull consumer to their side
// effect and settles each message by the outcome: ack once it ran (a replay
// is an outcome too), a delayed NAK when another delivery of it is running
// or the idempotency store is down, dead-lettering when no redelivery can
// succeed. JetStream delivers at least once; the message's key, the same on
// every delivery, lets the side effect run once.
//
// The side effect runs in one of two places. With Target, it is an HTTP
// endpoint protected by the idempotency middleware in key mode, and the
// relay POSTs each message there. With Process, it is a function of this
// program, run through idempotency.Do on Middleware; the relay reads Do's
// outcome as the answer the middleware would have sent, so both modes are
// settled by the same rules.
type Relay struct {
	// Consumer is the durable pull consumer to read. Several relays may
	// share one: the broker spreads the messages over them.
	Consumer jetstream.Consumer
	// Publisher publishes dead letters and waits for the stream to store
	// them.
	Publisher jetstream.Publisher
	// Target is the URL each message is POSTed to. Set Target or Process,
	// not both.
	Target string
	// Process runs the side effect of one message in this process, once
	// per key (messageKey) while its record lives: a redelivery gets its
	// stored outcome instead. It returns nil when the message is done, an
	// error marked Permanent for a message no redelivery can fix (it is
	// dead-lettered), or another error to be retried (the key is released
	// and a redelivery runs Process again, up to MaxServerErrors
	// deliveries). A panic counts as such an error.
	//
	// ctx carries the fencing token (idempotency.FencingToken) and is not
	// cancelled when the relay stops: a started Process finishes, within
	// the middleware's execution timeout, so that the redelivery finds its
	// outcome. It is cancelled with idempotency.ErrLockLost when the key's
	// lease is lost. Process must not settle msg; the relay does.
	Process func(ctx context.Context, key string, msg jetstream.Msg) error
	// Middleware runs Process under the idempotency protocol: the Redis
	// lock and lease, waiting duplicates, stored outcomes. Required with
	// Process. Relays that share a consumer need middlewares on one Redis
	// with one key prefix, or each runs what the others ran.
	Middleware *idempotency.Middleware
	// Scope separates the keys of two side effects fed by one stream, as
	// the route does in HTTP mode: a key run under one scope is never
	// replayed to another. With Process only. Default: the consumer's
	// name, which the relays sharing a consumer share.
	Scope string
	// DeadLetterSubject receives the messages the side effect refused for
	// good, with Relay-* headers saying why. A stream must capture it.
	DeadLetterSubject string
	// Concurrency is how many messages are in flight at once. Default 8.
	Concurrency int
	// Client sends the requests. Default: a client with a 30 s timeout,
	// longer than the middleware's wait for a concurrent duplicate (5 s),
	// that does not follow redirects.
	Client *http.Client
	// RetryDelay is the first redelivery delay when the endpoint gives no
	// Retry-After, doubled per delivery up to MaxRetryDelay. Defaults 1 s
	// and 30 s; MaxRetryDelay caps Retry-After too.
	RetryDelay, MaxRetryDelay time.Duration
	// MaxServerErrors is how many deliveries answered with a plain 5xx, or
	// on which Process failed, a message gets before it is dead-lettered.
	// Default 5.
	MaxServerErrors int
	// Logger receives dead letters (Warn) and retries (Debug). Default
	// slog.Default().
	Logger *slog.Logger
	// Stats counts what the relay did; read it at any time.
	Stats Stats
}

// Stats counts a relay's work.
type Stats struct {
	Delivered    atomic.Int64 // messages received, redeliveries included
	Acked        atomic.Int64
	Replayed     atomic.Int64 // outcomes replayed by the middleware, not run by this delivery
	Retried      atomic.Int64 // delayed NAKs
	DeadLettered atomic.Int64
	Abandoned    atomic.Int64 // in flight when the relay stopped: left to the broker's AckWait
	NetErrors    atomic.Int64
	status       [600]atomic.Int64
}

// Status counts the answers with HTTP status code. In-process it counts
// the status the middleware would have answered with: see doAnswer.
func (s *Stats) Status(code int) int64 {
	if code < 0 || code >= len(s.status) {
		return 0
	}
	return s.status[code].Load()
}

// Run relays messages until ctx ends. Messages in flight then are neither
// acked nor NAKed: the broker redelivers them after the consumer's AckWait,
// as it would after a crash, and whatever already ran is replayed.
func (r *Relay) Run(ctx context.Context) error {
	switch {
	case (r.Target == "") == (r.Process == nil):
		return errors.New("relay: set either Target or Process")
	case r.Process != nil && r.Middleware == nil:
		return errors.New("relay: Process needs a Middleware")
	}
	r.defaults()
	// Prefetch no more than the workers can take: a prefetched message's
	// AckWait is already running, and a stopped relay strands its buffer.
	iter, err := r.Consumer.Messages(jetstream.PullMaxMessages(r.Concurrency))
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for range r.Concurrency {
		wg.Go(func() { r.work(ctx, iter) })
	}
	<-ctx.Done()
	iter.Stop()
	wg.Wait()
	return nil
}

func (r *Relay) defaults() {
	if r.Concurrency <= 0 {
		r.Concurrency = 8
	}
	if r.Client == nil {
		r.Client = &http.Client{
			Timeout:       30 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if r.RetryDelay <= 0 {
		r.RetryDelay = time.Second
	}
	if r.MaxRetryDelay <= 0 {
		r.MaxRetryDelay = 30 * time.Second
	}
	if r.MaxServerErrors <= 0 {
		r.MaxServerErrors = 5
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	if r.Process != nil && r.Scope == "" {
		if info := r.Consumer.CachedInfo(); info != nil {
			r.Scope = info.Name
		}
	}
}

func (r *Relay) work(ctx context.Context, iter jetstream.MessagesContext) {
	for {
		msg, err := iter.Next(jetstream.NextContext(ctx))
		switch {
		case ctx.Err() != nil, errors.Is(err, jetstream.ErrMsgIteratorClosed):
			return
		case err != nil:
			// A missed heartbeat or a reconnect: the iterator pulls again.
			r.Logger.Debug("relay: waiting for messages", "error", err)
			continue
		}
		r.relay(ctx, msg)
	}
}

// relay hands one delivery to its side effect and settles it.
func (r *Relay) relay(ctx context.Context, msg jetstream.Msg) {
	r.Stats.Delivered.Add(1)
	meta, err := msg.Metadata()
	if err != nil {
		r.Logger.Error("relay: message without JetStream metadata", "subject", msg.Subject(), "error", err)
		msg.Term()
		return
	}
	key := messageKey(msg.Headers(), meta)
	policy := retryPolicy{base: r.RetryDelay, max: r.MaxRetryDelay, maxServerErrors: uint64(r.MaxServerErrors)}
	var a answer
	if r.Process != nil {
		a = r.process(ctx, msg, key)
	} else {
		a, err = r.post(ctx, msg, key, meta.NumDelivered)
	}
	if ctx.Err() != nil {
		r.Stats.Abandoned.Add(1)
		return
	}
	var v verdict
	if err != nil {
		r.Stats.NetErrors.Add(1)
		v = verdict{action: retry, delay: policy.delay("", meta.NumDelivered, time.Now()), reason: "network: " + err.Error()}
	} else {
		r.Stats.status[min(max(a.status, 0), len(r.Stats.status)-1)].Add(1)
		v = policy.judge(a, meta.NumDelivered, time.Now())
	}
	switch v.action {
	case ack:
		if a.replayed {
			r.Stats.Replayed.Add(1)
		}
		// A lost ack only costs a redelivery, which the endpoint replays.
		if err := msg.Ack(); err == nil {
			r.Stats.Acked.Add(1)
		}
	case retry:
		r.Stats.Retried.Add(1)
		r.Logger.Debug("relay: retrying", "key", key, "delivery", meta.NumDelivered, "in", v.delay, "reason", v.reason)
		msg.NakWithDelay(v.delay)
	case deadLetter:
		r.deadLetter(ctx, msg, meta, key, a, v, policy)
	}
}

// post sends one delivery to the target.
func (r *Relay) post(ctx context.Context, msg jetstream.Msg, key string, delivered uint64) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.Target, bytes.NewReader(msg.Data()))
	if err != nil {
		return answer{}, err
	}
	contentType := msg.Headers().Get("Content-Type")
	if contentType == "" {
		contentType = "application/json"
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set(idempotency.KeyHeader, key)
	// Informational: headers are not part of the request fingerprint, so
	// they may differ between deliveries.
	req.Header.Set("Relay-Subject", msg.Subject())
	req.Header.Set("Relay-Delivery", strconv.FormatUint(delivered, 10))
	resp, err := r.Client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	return readAnswer(resp), nil
}

// process runs Process on one delivery through idempotency.Do, with the
// message's data as the input: the same key with other data is refused.
func (r *Relay) process(ctx context.Context, msg jetstream.Msg, key string) (a answer) {
	defer func() {
		// Do has released the key; the panic becomes a failure to retry, as
		// an HTTP server turns a handler's panic into a failed request,
		// rather than ending every delivery in flight with the relay.
		if p := recover(); p != nil {
			r.Logger.Error("relay: Process panicked", "key", key, "panic", p, "stack", string(debug.Stack()))
			a = doAnswer(fmt.Errorf("panic: %v", p), true)
		}
	}()
	in := idempotency.Key{Scope: r.Scope, ID: key, Input: msg.Data()}
	var outcome idempotency.Outcome
	_, err := idempotency.Do(ctx, r.Middleware, in, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, r.Process(ctx, key, msg)
	}, idempotency.ReportOutcome(&outcome))
	return doAnswer(err, outcome == idempotency.Executed)
}

// deadLetter publishes the message to the dead-letter subject and only
// then terminates it, so that it is never lost: when the publish fails the
// message is NAKed and the broker brings it back.
func (r *Relay) deadLetter(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, key string, a answer, v verdict, policy retryPolicy) {
	dl := nats.NewMsg(r.DeadLetterSubject)
	dl.Data = msg.Data()
	for name, values := range msg.Headers() {
		if name != jetstream.MsgIDHeader {
			dl.Header[name] = values
		}
	}
	seq := strconv.FormatUint(meta.Sequence.Stream, 10)
	// The stored message's own identity: dead-lettering it again after a
	// lost Term is deduplicated by the dead-letter stream.
	dl.Header.Set(jetstream.MsgIDHeader, meta.Stream+":"+seq)
	dl.Header.Set("Relay-Key", key)
	dl.Header.Set("Relay-Stream", meta.Stream)
	dl.Header.Set("Relay-Sequence", seq)
	dl.Header.Set("Relay-Subject", msg.Subject())
	dl.Header.Set("Relay-Status", strconv.Itoa(a.status))
	dl.Header.Set("Relay-Problem", a.problem)
	dl.Header.Set("Relay-Reason", v.reason)
	if _, err := r.Publisher.PublishMsg(ctx, dl); err != nil {
		r.Stats.Retried.Add(1)
		r.Logger.Error("relay: dead-lettering failed; retrying the message", "key", key, "error", err)
		msg.NakWithDelay(policy.delay("", meta.NumDelivered, time.Now()))
		return
	}
	r.Stats.DeadLettered.Add(1)
	r.Logger.Warn("relay: dead-lettered", "key", key, "subject", r.DeadLetterSubject, "reason", v.reason)
	msg.TermWithReason(v.reason)
}
