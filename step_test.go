package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/stretchr/testify/require"
)

// provider is a payment provider that honours its own idempotency key: a
// charge repeated with the same key is one charge, answered the same.
type provider struct {
	mu      sync.Mutex
	calls   []string          // the key of every call
	charges map[string]string // key → charge id
}

func (p *provider) charge(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, key)
	if p.charges == nil {
		p.charges = map[string]string{}
	}
	if id, ok := p.charges[key]; ok {
		return id
	}
	id := fmt.Sprintf("ch_%d", len(p.charges)+1)
	p.charges[key] = id
	return id
}

func (p *provider) seen() (calls []string, charges int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.calls...), len(p.charges)
}

// resumeTiming is short enough that the claim horizon passes within a
// test: 500 ms of execution, 200 ms leases, 100 ms store steps.
var resumeTiming = []Option{WithExecutionTimeout(500 * time.Millisecond), WithLockLease(200 * time.Millisecond),
	WithStoreTimeout(100 * time.Millisecond), WithWaitTimeout(10 * time.Second)}

// darkable is an instance whose Redis goes through a proxy, which the test
// can black-hole: the instance is as good as dead to Redis, its lock
// lapses, and nothing it sends lands.
func darkable(t *testing.T, prefix string, opts ...Option) (*Middleware, *redistest.Proxy) {
	redistest.Client(t, prefix) // the prefix is cleaned up when the test ends
	o, err := redistest.SharedOptions()
	require.NoError(t, err)
	proxy := redistest.NewProxy(t, o.Addr)
	return New(clientTo(t, proxy.Addr()), append([]Option{WithKeyPrefix(prefix)}, opts...)...), proxy
}

// An instance dies between two steps, or in the middle of one (after the
// provider charged, before the journal had it). The next call resumes:
// every journaled step returns its result without running, the step that
// was cut off runs again with the same StepKey (so the provider charges
// once), and the answer is built from the journaled results.
func TestStepResumesAfterTheExecutorDies(t *testing.T) {
	for _, dies := range []string{"between steps", "mid-step"} {
		t.Run(dies, func(t *testing.T) {
			prefix := "test-" + strings.ReplaceAll(t.Name(), "/", "-")
			a, proxy := darkable(t, prefix, resumeTiming...)
			b := New(redistest.Client(t, prefix), append([]Option{WithKeyPrefix(prefix)}, resumeTiming...)...)
			var p *provider
			var shipped atomic.Int64
			var dark chan struct{}
			fn := func(first bool) func(context.Context) (string, error) {
				return func(ctx context.Context) (string, error) {
					id, err := Step(ctx, "charge", func(ctx context.Context) (string, error) {
						id := p.charge(StepKey(ctx, "charge"))
						if first && dies == "mid-step" {
							close(dark)
							<-ctx.Done() // the execution timeout
						}
						return id, nil
					})
					if err != nil {
						return "", err
					}
					n, err := Step(ctx, "ship", func(ctx context.Context) (int64, error) {
						if first {
							if dies == "between steps" {
								close(dark)
							}
							<-ctx.Done()
							return 0, ctx.Err()
						}
						return shipped.Add(1), nil
					})
					return fmt.Sprintf("%s/%d", id, n), err
				}
			}
			// The first execution, until it dies where the test says. On a
			// busy machine its 100 ms store steps may fail first: it then
			// ends before it got there, and goes again under a new key.
			first := make(chan error, 1)
			var key Key
			for attempt := 0; dark == nil; attempt++ {
				require.Less(t, attempt, 5, "the first execution never got to where it dies")
				p, key, dark = &provider{}, Key{ID: fmt.Sprint("k", attempt)}, make(chan struct{})
				go func() {
					_, err := Do(context.Background(), a, key, fn(true), Resumable())
					first <- err
				}()
				select {
				case <-dark:
				case err := <-first:
					t.Logf("the first execution ended before it died (%v); again under a new key", err)
					dark = nil
				}
			}
			proxy.StartBlackhole() // the instance is gone to Redis

			var o Outcome
			got, err := Do(context.Background(), b, key, fn(false), Resumable(), ReportOutcome(&o))
			require.NoError(t, err)
			require.Equal(t, Executed, o)
			require.Equal(t, "ch_1/1", got)
			calls, charges := p.seen()
			require.Equal(t, 1, charges, "one charge")
			if dies == "mid-step" {
				require.Len(t, calls, 2, "the cut step ran again")
				require.Equal(t, calls[0], calls[1], "with the same step key")
			} else {
				require.Len(t, calls, 1, "the journaled step did not run again")
			}

			proxy.EndBlackhole()
			require.Error(t, <-first)
			again, err := Do(context.Background(), b, key, fn(false), Resumable(), ReportOutcome(&o))
			require.NoError(t, err)
			require.Equal(t, Replayed, o)
			require.Equal(t, got, again)
			require.EqualValues(t, 1, shipped.Load())
		})
	}
}

// A step's key is stable for the key and the step, differs between steps,
// keys and callers, and is empty outside a protected execution.
func TestStepKey(t *testing.T) {
	m, _ := twoInstances(t)
	keyOf := func(key Key, step string) string {
		got, err := Do(context.Background(), m, key, func(ctx context.Context) (string, error) {
			Release(ctx) // run again next time
			return StepKey(ctx, step), nil
		})
		require.NoError(t, err)
		return got
	}
	k := keyOf(Key{ID: "k", Input: []byte("a")}, "charge")
	require.Len(t, k, 32)
	require.Equal(t, k, keyOf(Key{ID: "k", Input: []byte("a")}, "charge"))
	require.NotEqual(t, k, keyOf(Key{ID: "k", Input: []byte("a")}, "ship"))
	require.NotEqual(t, k, keyOf(Key{ID: "k2", Input: []byte("a")}, "charge"))
	require.NotEqual(t, k, keyOf(Key{ID: "k", Scope: "other", Input: []byte("a")}, "charge"))
	require.NotEqual(t, k, keyOf(Key{ID: "k", Input: []byte("b")}, "charge"))
	require.Empty(t, StepKey(context.Background(), "charge"))
}

// Outside a protected execution Step runs its function plainly; inside
// one a name is used once.
func TestStepOutsideAndRepeated(t *testing.T) {
	v, err := Step(context.Background(), "x", func(context.Context) (int, error) { return 7, nil })
	require.NoError(t, err)
	require.Equal(t, 7, v)

	m, _ := twoInstances(t)
	for _, opts := range [][]DoOption{nil, {Resumable()}} {
		runs := 0
		_, err = Do(context.Background(), m, Key{ID: fmt.Sprint(len(opts))}, func(ctx context.Context) (int, error) {
			step := func(context.Context) (int, error) { runs++; return runs, nil }
			if _, err := Step(ctx, "x", step); err != nil {
				return 0, err
			}
			return Step(ctx, "x", step)
		}, opts...)
		require.ErrorIs(t, err, ErrStepRepeated)
		require.Equal(t, 1, runs)
	}
}

// A step that takes the journal past WithMaxResponseBytes fails with
// ErrStepTooLarge, its result returned, nothing journaled.
func TestStepSizeBound(t *testing.T) {
	m, _ := twoInstances(t, WithMaxResponseBytes(64))
	k := functionKeys(m, "k")
	_, err := Do(context.Background(), m, Key{ID: "k"}, func(ctx context.Context) (string, error) {
		v, err := Step(ctx, "small", func(context.Context) (string, error) { return strings.Repeat("a", 30), nil })
		require.NoError(t, err)
		require.Len(t, v, 30)
		v, err = Step(ctx, "big", func(context.Context) (string, error) { return strings.Repeat("b", 40), nil })
		require.ErrorIs(t, err, ErrStepTooLarge)
		require.Len(t, v, 40, "the step ran: its result comes back with the error")
		rec, rerr := redistest.ReadRecord(ctx, m.redis.client, k.record)
		require.NoError(t, rerr)
		require.Equal(t, "sv 5 32\nsmall\""+strings.Repeat("a", 30)+"\"", rec.Journal)
		return v, err
	}, Resumable())
	require.ErrorIs(t, err, ErrStepTooLarge)
}

// Which errors are journaled: one marked Permanent comes back to the run
// that resumes, as a StoredError, without running the step; any other
// error, and a cancellation even marked Permanent, runs the step again.
func TestStepErrorRules(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       func(ctx context.Context) error
		journaled bool
	}{
		{"permanent", func(context.Context) error { return Permanent(errors.New("card declined")) }, true},
		{"plain", func(context.Context) error { return errors.New("provider timed out") }, false},
		{"cancellation marked permanent", func(context.Context) error { return Permanent(context.DeadlineExceeded) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := twoInstances(t)
			runs := 0
			_, err := Do(context.Background(), a, Key{ID: "k"}, func(ctx context.Context) (int, error) {
				return Step(ctx, "charge", func(ctx context.Context) (int, error) { runs++; return 0, tc.err(ctx) })
			}, Resumable())
			require.Error(t, err)
			var stored *StoredError
			require.False(t, errors.As(err, &stored), "the first run gets the step's own error")

			_, err = Do(context.Background(), b, Key{ID: "k"}, func(ctx context.Context) (int, error) {
				return Step(ctx, "charge", func(ctx context.Context) (int, error) { runs++; return 1, nil })
			}, Resumable())
			if tc.journaled {
				require.ErrorAs(t, err, &stored, "the journaled failure comes back")
				require.Equal(t, "card declined", stored.Message)
				require.Equal(t, 1, runs)
			} else {
				require.NoError(t, err)
				require.Equal(t, 2, runs, "the step ran again")
			}
		})
	}
}

// An executor whose key was taken over journals nothing: step.lua finds
// the record naming another run.
func TestAFencedOutExecutorCannotJournal(t *testing.T) {
	m, _ := twoInstances(t, WithLockLease(100*time.Millisecond))
	ctx := t.Context()
	k := functionKeys(m, "k")
	k.resume = true
	stale := claimFor(t, m, k, "fp")
	ok, err := m.redis.journal(ctx, k, stale, appendEntry(nil, entryResult, "a", []byte("1")), 0)
	require.NoError(t, err)
	require.Equal(t, 1, ok.owned)
	require.Eventually(t, func() bool { return m.redis.client.Exists(ctx, k.lock).Val() == 0 },
		10*time.Second, time.Millisecond, "the lease runs out")
	require.NoError(t, redistest.Age(ctx, m.redis.client, k.record, time.Hour))

	lock, err := newTestLock()
	require.NoError(t, err)
	c, err := m.redis.claim(ctx, k, lock.Value(), "fp")
	require.NoError(t, err)
	require.Equal(t, outcomeClaimed, c.outcome)
	require.True(t, c.retaken)
	require.NotNil(t, c.journal)
	require.Equal(t, "sv 1 1\na1", *c.journal, "the takeover got the journal")

	ok, err = m.redis.journal(ctx, k, stale, appendEntry(nil, entryResult, "b", []byte("2")), len(*c.journal))
	require.NoError(t, err)
	require.Equal(t, 0, ok.owned, "the stale executor is fenced out")
	ok, err = m.redis.journal(ctx, k, lock.Value(), appendEntry(nil, entryResult, "b", []byte("3")), len(*c.journal))
	require.NoError(t, err)
	require.Equal(t, 1, ok.owned)
	ok, err = m.redis.journal(ctx, k, lock.Value(), appendEntry(nil, entryResult, "b", []byte("3")), len(*c.journal))
	require.NoError(t, err)
	require.Equal(t, 1, ok.owned, "a resend finds its entry written")
	rec, err := redistest.ReadRecord(ctx, m.redis.client, k.record)
	require.NoError(t, err)
	require.Equal(t, "sv 1 1\na1sv 1 1\nb3", rec.Journal)
	st, err := m.operated().Inspect(ctx, k.record)
	require.NoError(t, err)
	require.Equal(t, "run", st.State, "the operator reads a record with a journal")
	require.Equal(t, c.fence, st.Fence)
}

// claimFor claims k for a test's executor and returns its lock value.
func claimFor(t *testing.T, m *Middleware, k keys, fp string) string {
	t.Helper()
	for range 100 {
		lock, err := newTestLock()
		require.NoError(t, err)
		c, err := m.redis.claim(t.Context(), k, lock.Value(), fp)
		require.NoError(t, err)
		if c.outcome == outcomeHeld {
			continue // another executor's lock has not run out yet
		}
		require.Equal(t, outcomeClaimed, c.outcome)
		return lock.Value()
	}
	t.Fatal("in 100 attempts no claim ran within its lease")
	return ""
}

// A protected route with WithResume, in key mode and in token mode: the
// route's abandoned run is resumed by the retry, whose handler gets the
// journaled step back and answers from it; a panic after a journaled step
// keeps the key for the next retry to resume instead of releasing it
// (which would repeat the step).
func TestResumeOnAProtectedRoute(t *testing.T) {
	for _, route := range []string{"/payments", "/orders"} {
		t.Run(route, func(t *testing.T) {
			s := newShop(t, WithResume())
			var p provider
			var panicked atomic.Bool
			s.handler = func(w http.ResponseWriter, r *http.Request) {
				id, err := Step(r.Context(), "charge", func(ctx context.Context) (string, error) {
					return p.charge(StepKey(ctx, "charge")), nil
				})
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadGateway)
					return
				}
				if !panicked.Swap(true) {
					panic("the instance breaks after the charge")
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"charge":%q}`, id)
			}
			c := s.client()
			key := "k"
			if route == "/orders" {
				key = s.token(c)
			}
			// The panic drops the connection: on a transport of its own,
			// which does not resend.
			dropped := &http.Client{Jar: c.Jar, Transport: &http.Transport{}}
			req, err := http.NewRequest(http.MethodPost, s.srv.URL+route, strings.NewReader(`{}`))
			require.NoError(t, err)
			req.Header.Set(KeyHeader, key)
			if resp, err := dropped.Do(req); err == nil {
				resp.Body.Close()
			}

			a := s.post(c, route, key, `{}`)
			require.Equal(t, http.StatusCreated, a.status, a.body)
			require.Equal(t, `{"charge":"ch_1"}`, a.body)
			calls, charges := p.seen()
			require.Equal(t, 1, charges)
			require.Len(t, calls, 1, "the journaled charge was not called again")
			require.EqualValues(t, 2, s.execs.Load())
			dup := s.post(c, route, key, `{}`)
			require.Equal(t, "true", dup.header.Get(ReplayedHeader))
			require.Equal(t, a.body, dup.body)
		})
	}
}

// Without WithResume nothing changes: Step runs its function and journals
// nothing, and a run whose executor is gone still reads interrupted.
func TestNoResumeNoJournal(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond))
	k := clientKeys(s.idem.cfg.prefix, paymentID("k"))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		_, err := Step(r.Context(), "charge", func(context.Context) (int, error) { return 1, nil })
		require.NoError(t, err)
		rec, err := redistest.ReadRecord(r.Context(), s.rdb, k.record)
		require.NoError(t, err)
		require.Empty(t, rec.Journal)
		w.Header().Set("X-Step-Key", StepKey(r.Context(), "charge"))
		s.rdb.Del(r.Context(), k.lock)
		require.NoError(t, s.idem.redis.keep(r.Context(), k, rec.Owner)) // as if the instance died here
		panic(http.ErrAbortHandler)
	}
	s.postDropped("/payments", "k", `{}`)
	requireProblem(t, s.post(s.client(), "/payments", "k", `{}`), http.StatusConflict, "interrupted")
	require.EqualValues(t, 1, s.execs.Load())
}

// A live run is never resumed, not even while its lock has lapsed (a
// stalled Redis): a duplicate waits for its answer.
func TestALiveRunIsNeverResumed(t *testing.T) {
	a, b := twoInstances(t, WithLockLease(200*time.Millisecond), WithWaitTimeout(10*time.Second))
	k := functionKeys(a, "k")
	var runs atomic.Int64
	started := make(chan struct{})
	fn := func(ctx context.Context) (int64, error) {
		return Step(ctx, "slow", func(ctx context.Context) (int64, error) {
			n := runs.Add(1)
			if n == 1 {
				close(started)
				time.Sleep(700 * time.Millisecond) // past three leases, renewed
				a.redis.client.Del(ctx, k.lock)    // a stall lets the lock lapse
				time.Sleep(700 * time.Millisecond)
			}
			return n, nil
		})
	}
	first := make(chan int64, 1)
	go func() {
		v, err := Do(context.Background(), a, Key{ID: "k"}, fn, Resumable())
		if err != nil {
			v = -1
		}
		first <- v
	}()
	<-started
	var o Outcome
	got, err := Do(context.Background(), b, Key{ID: "k"}, fn, Resumable(), ReportOutcome(&o))
	require.NoError(t, err)
	require.EqualValues(t, 1, got)
	require.Equal(t, Waited, o)
	require.EqualValues(t, 1, <-first)
	require.EqualValues(t, 1, runs.Load())
}

// A Release after a journaled step does not release the key (it would drop
// the journal): the run is kept, not stored, and the retry resumes it, the
// step not run again. A Release before any step still releases the key.
func TestReleaseAfterAStepKeepsTheRun(t *testing.T) {
	a, b := twoInstances(t)
	runs := 0
	fn := func(release bool) func(context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			n, err := Step(ctx, "charge", func(context.Context) (int, error) { runs++; return runs, nil })
			if release {
				Release(ctx)
			}
			return n, err
		}
	}
	_, err := Do(context.Background(), a, Key{ID: "k"}, fn(true), Resumable())
	require.NoError(t, err)
	var o Outcome
	got, err := Do(context.Background(), b, Key{ID: "k"}, fn(false), Resumable(), ReportOutcome(&o))
	require.NoError(t, err)
	require.Equal(t, Executed, o, "the run was kept, and the retry resumed it")
	require.Equal(t, 1, got)
	require.Equal(t, 1, runs)

	_, err = Do(context.Background(), a, Key{ID: "early"}, func(ctx context.Context) (int, error) {
		Release(ctx)
		return 0, nil
	}, Resumable())
	require.NoError(t, err)
	require.Empty(t, redistest.RecordState(context.Background(), a.redis.client, functionKeys(a, "early").record))
}
