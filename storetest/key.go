package storetest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency"
)

// The key-mode promises (ProtectKey).

func concurrentDuplicatesShared(t *testing.T, ks Keyspace) {
	concurrentDuplicates(t, ks, idempotency.WithSharedKeys(), nil)
}

// Under WithCallerCredentials the caller's credentials are part of the
// request: another caller with the same key and body is refused, never
// given the first caller's answer.
func concurrentDuplicatesCredentials(t *testing.T, ks Keyspace) {
	a, b := concurrentDuplicates(t, ks, idempotency.WithCallerCredentials(), []string{"Authorization", "Bearer alice"})
	for _, in := range []*instance{a, b} {
		requireProblem(t, post(t, in.url, "k", `{"item":"tea"}`, "Authorization", "Bearer bob"),
			http.StatusUnprocessableEntity, "key-reused")
	}
}

// concurrentDuplicates: identical requests sent at once to two instances
// run the handler once, and every one gets its answer byte for byte, the
// first as the handler wrote it, the others replayed; so do later
// duplicates, on a third instance too. It returns the two instances.
func concurrentDuplicates(t *testing.T, ks Keyspace, callers idempotency.Option, header []string) (a, b *instance) {
	const requests = 16
	var h runs
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.start(r.Context())
		body, _ := io.ReadAll(r.Body)
		// Hold the run until every request has reached a server, so
		// that the others are duplicates of a running key; on a slow
		// machine, late ones are duplicates of a stored one, which must
		// answer the same.
		eventually(func() bool { return a.arrivals.Load()+b.arrivals.Load() >= requests })
		created(w, n, string(body))
	})
	opts := []idempotency.Option{callers, idempotency.WithWaitTimeout(3 * bound)}
	a, b = serveKey(t, ks, handler, opts...), serveKey(t, ks, handler, opts...)

	answers := make([]answer, requests)
	errs := make([]error, requests)
	var wg sync.WaitGroup
	for i := range requests {
		in := a
		if i%2 == 1 {
			in = b
		}
		wg.Go(func() { answers[i], errs[i] = send(in.url, "k", `{"item":"tea"}`, header...) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, h.count(), "the handler ran more than once")
	first := answers[0]
	require.Equal(t, http.StatusCreated, first.status, "answer: %s", first)
	require.Equal(t, "1", first.header.Get("X-Order"))
	require.JSONEq(t, `{"order":1,"what":"{\"item\":\"tea\"}"}`, first.body)
	notReplayed := 0
	for _, ans := range answers {
		require.Equal(t, first.same(), ans.same())
		if !ans.replayed() {
			notReplayed++
		}
	}
	require.Equal(t, 1, notReplayed, "exactly one answer (the run's own) is not marked replayed")

	c := serveKey(t, ks, handler, opts...)
	for _, in := range []*instance{a, b, c} {
		requireReplay(t, first, post(t, in.url, "k", `{"item":"tea"}`, header...))
	}
	require.EqualValues(t, 1, h.count())
	return a, b
}

// An answer one instance stored is replayed by every other, one opened
// after it included.
func replayedByAnotherInstance(t *testing.T, ks Keyspace) {
	var h runs
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		created(w, h.start(r.Context()), "tea")
	})
	a := serveKey(t, ks, handler, idempotency.WithSharedKeys())
	b := serveKey(t, ks, handler, idempotency.WithSharedKeys())
	first := post(t, a.url, "k", `{"item":"tea"}`)
	require.Equal(t, http.StatusCreated, first.status, "answer: %s", first)
	require.False(t, first.replayed())
	requireReplay(t, first, post(t, b.url, "k", `{"item":"tea"}`))
	c := serveKey(t, ks, handler, idempotency.WithSharedKeys())
	requireReplay(t, first, post(t, c.url, "k", `{"item":"tea"}`))
	require.EqualValues(t, 1, h.count())

	// Another key is another request.
	other := post(t, b.url, "k2", `{"item":"tea"}`)
	require.Equal(t, http.StatusCreated, other.status)
	require.False(t, other.replayed())
	require.EqualValues(t, 2, h.count())
}

// The same key with another body is refused, on every instance, and the
// first request's answer stays the key's.
func reusedKeyRefused(t *testing.T, ks Keyspace) {
	var h runs
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		created(w, h.start(r.Context()), "tea")
	})
	a := serveKey(t, ks, handler, idempotency.WithSharedKeys())
	b := serveKey(t, ks, handler, idempotency.WithSharedKeys())
	first := post(t, a.url, "k", `{"item":"tea"}`)
	require.Equal(t, http.StatusCreated, first.status, "answer: %s", first)
	for _, in := range []*instance{a, b} {
		requireProblem(t, post(t, in.url, "k", `{"item":"cake"}`), http.StatusUnprocessableEntity, "key-reused")
	}
	requireReplay(t, first, post(t, b.url, "k", `{"item":"tea"}`))
	require.EqualValues(t, 1, h.count())
}

// Under the default store policy (StoreAll) an error answer is stored and
// replayed like any other: the handler may have had effects before it
// failed.
func errorStoredByDefault(t *testing.T, ks Keyspace) {
	var h runs
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.start(r.Context())
		w.Header().Set("X-Order", strconv.FormatInt(n, 10))
		http.Error(w, "the warehouse failed", http.StatusInternalServerError)
	})
	a := serveKey(t, ks, handler, idempotency.WithSharedKeys())
	b := serveKey(t, ks, handler, idempotency.WithSharedKeys())
	first := post(t, a.url, "k", `{"item":"tea"}`)
	require.Equal(t, http.StatusInternalServerError, first.status, "answer: %s", first)
	requireReplay(t, first, post(t, b.url, "k", `{"item":"tea"}`))
	requireReplay(t, first, post(t, a.url, "k", `{"item":"tea"}`))
	require.EqualValues(t, 1, h.count())
}

// An answer the store policy releases (StoreNoTransient: a 503) is not
// stored: a retry, on another instance, runs the handler again under a
// greater fencing token, and that run is the key's like any first run: a
// duplicate that arrives while it runs, on a third instance, waits for it
// and gets its answer, and so does every later one.
func releasedAnswerRunsAgain(t *testing.T, ks Keyspace) {
	var h runs
	started, finish := make(chan struct{}), make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.start(r.Context())
		switch n {
		case 1:
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		case 2:
			close(started)
			await(finish)
		}
		created(w, n, "tea")
	})
	opts := []idempotency.Option{idempotency.WithSharedKeys(), idempotency.WithStorePolicy(idempotency.StoreNoTransient),
		idempotency.WithWaitTimeout(3 * bound)}
	a, b, c := serveKey(t, ks, handler, opts...), serveKey(t, ks, handler, opts...), serveKey(t, ks, handler, opts...)
	first := post(t, a.url, "k", `{"item":"tea"}`)
	require.Equal(t, http.StatusServiceUnavailable, first.status, "answer: %s", first)
	require.False(t, first.replayed())

	retryDone := goSend(b.url, "k", `{"item":"tea"}`)
	require.True(t, await(started), "the retry never ran")
	dupDone := goSend(c.url, "k", `{"item":"tea"}`)
	settle(c, 1)
	close(finish)
	retry, dup := <-retryDone, <-dupDone
	require.Equal(t, http.StatusCreated, retry.status, "answer: %s", retry)
	require.False(t, retry.replayed())
	requireReplay(t, retry, dup)
	require.EqualValues(t, 2, h.count())
	h.requireFencesGrow(t)

	requireReplay(t, retry, post(t, a.url, "k", `{"item":"tea"}`))
	require.EqualValues(t, 2, h.count())
}

// A duplicate that arrives while the first request still runs waits for
// it and gets its answer, on the first's instance and on another.
func duplicateWaits(t *testing.T, ks Keyspace) {
	var h runs
	started := map[string]chan struct{}{"same": make(chan struct{}), "other": make(chan struct{})}
	finish := map[string]chan struct{}{"same": make(chan struct{}), "other": make(chan struct{})}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.start(r.Context())
		key := r.Header.Get(idempotency.KeyHeader)
		close(started[key])
		await(finish[key])
		created(w, n, key)
	})
	opts := []idempotency.Option{idempotency.WithSharedKeys(), idempotency.WithWaitTimeout(3 * bound)}
	a, b := serveKey(t, ks, handler, opts...), serveKey(t, ks, handler, opts...)
	for _, c := range []struct {
		key string
		dup *instance
	}{{"same", a}, {"other", b}} {
		t.Run(c.key+" instance", func(t *testing.T) {
			before := h.count()
			firstDone := goSend(a.url, c.key, `{"item":"tea"}`)
			require.True(t, await(started[c.key]), "the first request never ran")
			arrived := c.dup.arrivals.Load()
			dupDone := goSend(c.dup.url, c.key, `{"item":"tea"}`)
			settle(c.dup, arrived+1)
			close(finish[c.key])
			first, dup := <-firstDone, <-dupDone
			require.Equal(t, http.StatusCreated, first.status, "answer: %s", first)
			require.False(t, first.replayed())
			requireReplay(t, first, dup)
			require.Equal(t, before+1, h.count())
		})
	}
}

// With a short wait, a duplicate of a key whose first request still runs
// is answered 409 in-progress with Retry-After, on the first's instance
// and on another; once the first finishes, a retry gets its answer.
func duplicatePastTheWait(t *testing.T, ks Keyspace) {
	var h runs
	started, finish := make(chan struct{}), make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.start(r.Context())
		close(started)
		await(finish)
		created(w, n, "tea")
	})
	opts := []idempotency.Option{idempotency.WithSharedKeys(), idempotency.WithWaitTimeout(100 * time.Millisecond)}
	a, b := serveKey(t, ks, handler, opts...), serveKey(t, ks, handler, opts...)
	firstDone := goSend(a.url, "k", `{"item":"tea"}`)
	require.True(t, await(started), "the first request never ran")
	for _, in := range []*instance{a, b} {
		dup := post(t, in.url, "k", `{"item":"tea"}`)
		requireProblem(t, dup, http.StatusConflict, "in-progress")
		after, err := strconv.Atoi(dup.header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After %q", dup.header.Get("Retry-After"))
		require.Positive(t, after)
	}
	close(finish)
	first := <-firstDone
	require.Equal(t, http.StatusCreated, first.status, "answer: %s", first)
	requireReplay(t, first, post(t, b.url, "k", `{"item":"tea"}`))
	require.EqualValues(t, 1, h.count())
}

// A run the execution timeout cuts off, whose handler does not succeed,
// may have taken effect: its key is kept, and a retry is answered 409
// interrupted on every instance. An instance with WithRetryAbandoned takes
// it over: the handler runs again under a greater fencing token, and its
// answer is the key's.
func cutOffRunKept(t *testing.T, ks Keyspace) {
	var h runs
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.start(r.Context())
		if n == 1 {
			select {
			case <-r.Context().Done():
			case <-time.After(bound):
			}
			http.Error(w, "cut off", http.StatusServiceUnavailable)
			return
		}
		created(w, n, "tea")
	})
	a := serveKey(t, ks, handler, idempotency.WithSharedKeys(), idempotency.WithExecutionTimeout(300*time.Millisecond))
	b := serveKey(t, ks, handler, idempotency.WithSharedKeys())
	first := post(t, a.url, "k", `{"item":"tea"}`)
	require.Equal(t, http.StatusServiceUnavailable, first.status, "answer: %s", first)
	for _, in := range []*instance{a, b} {
		requireProblem(t, post(t, in.url, "k", `{"item":"tea"}`), http.StatusConflict, "interrupted")
	}
	require.EqualValues(t, 1, h.count())

	c := serveKey(t, ks, handler, idempotency.WithSharedKeys(), idempotency.WithRetryAbandoned())
	taken := post(t, c.url, "k", `{"item":"tea"}`)
	require.Equal(t, http.StatusCreated, taken.status, "answer: %s", taken)
	require.False(t, taken.replayed())
	require.EqualValues(t, 2, h.count())
	h.requireFencesGrow(t)
	for _, in := range []*instance{a, b, c} {
		requireReplay(t, taken, post(t, in.url, "k", `{"item":"tea"}`))
	}
	require.EqualValues(t, 2, h.count())
}

// A handler that panics before it writes did nothing a retry must not
// repeat: the key is released, and a retry runs the handler again.
func panicReleases(t *testing.T, ks Keyspace) {
	var h runs
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := h.start(r.Context())
		if n == 1 {
			panic(fmt.Sprintf("run %d fails", n))
		}
		created(w, n, "tea")
	})
	a := serveKey(t, ks, handler, idempotency.WithSharedKeys())
	b := serveKey(t, ks, handler, idempotency.WithSharedKeys())
	first := post(t, a.url, "k", `{"item":"tea"}`)
	require.Equal(t, http.StatusInternalServerError, first.status, "answer: %s", first)
	require.Equal(t, "recovered", first.body, "the panic goes on to the server's recoverer")

	retry := post(t, b.url, "k", `{"item":"tea"}`)
	require.Equal(t, http.StatusCreated, retry.status, "answer: %s", retry)
	require.False(t, retry.replayed())
	require.EqualValues(t, 2, h.count())
	requireReplay(t, retry, post(t, a.url, "k", `{"item":"tea"}`))
	require.EqualValues(t, 2, h.count())
}

// Ready is nil on a healthy store.
func ready(t *testing.T, ks Keyspace) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	require.NoError(t, open(t, ks).Ready(ctx))
}
