package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Release reports what it did: before a step it releases the key, and
// after a journaled step, whose key is kept for a retry to resume, it says
// false rather than a true that a client told "fix and retry with the same
// key" would find broken (422 key-reused until the record expires).
func TestReleaseReportsWhatItDidAroundSteps(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stepFirst bool
		released  bool
	}{
		{"before any step", false, true},
		{"after a journaled step", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := twoInstances(t)
			var said bool
			_, err := Do(context.Background(), m, Key{ID: "k"}, func(ctx context.Context) (int, error) {
				if tc.stepFirst {
					if _, err := Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
						return 0, err
					}
				}
				said = Release(ctx)
				return 0, nil
			}, Resumable())
			require.NoError(t, err)
			require.Equal(t, tc.released, said)
			rec, err := m.redis.client.Exists(context.Background(), functionKeys(m, "k").record).Result()
			require.NoError(t, err)
			require.Equal(t, tc.released, rec == 0, "Release said %v", said)
		})
	}
}

// A run whose step took effect and whose work then answers "not executed"
// (a database that failed, through WriteError or Release) is kept, never
// stored: its "in progress" answer is not the key's. With WithResume the
// retry resumes it (the charge not made again) and gets its answer; without,
// the key stays interrupted, and nothing runs the charge a second time.
func TestAnUnavailableAnswerAfterAStepKeepsTheRun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		resume bool
		fail   func(w http.ResponseWriter, r *http.Request)
	}{
		{"WriteError, resumable", true, func(w http.ResponseWriter, r *http.Request) {
			WriteError(w, r, fmt.Errorf("%w: the database went away", ErrStoreUnavailable))
		}},
		{"Release, resumable", true, func(w http.ResponseWriter, r *http.Request) {
			Release(r.Context())
			WriteError(w, r, fmt.Errorf("%w: the database went away", ErrStoreUnavailable))
		}},
		{"WriteError, not resumable", false, func(w http.ResponseWriter, r *http.Request) {
			WriteError(w, r, fmt.Errorf("%w: the database went away", ErrStoreUnavailable))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []Option
			if tc.resume {
				opts = append(opts, WithResume())
			}
			s := newShop(t, opts...)
			var charges, runs atomic.Int64
			s.handler = func(w http.ResponseWriter, r *http.Request) {
				if _, err := Step(r.Context(), "charge", func(context.Context) (int64, error) { return charges.Add(1), nil }); err != nil {
					http.Error(w, "step", http.StatusBadGateway)
					return
				}
				if runs.Add(1) == 1 {
					tc.fail(w, r)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, `{"ordered":true}`)
			}
			c := s.client()
			first := s.post(c, "/payments", "k", `{}`)
			require.Equal(t, http.StatusConflict, first.status, first.body)
			var last answer
			for range 3 {
				last = s.post(c, "/payments", "k", `{}`)
				require.NotEqual(t, "true", last.header.Get(ReplayedHeader), "the first answer was stored: %s", last.body)
				if last.status == http.StatusCreated {
					break
				}
			}
			require.EqualValues(t, 1, charges.Load(), "the charge ran once")
			if !tc.resume {
				require.Equal(t, http.StatusConflict, last.status, "the key is kept, never run again: %s", last.body)
				require.EqualValues(t, 1, runs.Load())
				return
			}
			require.Equal(t, http.StatusCreated, last.status, last.body)
			dup := s.post(c, "/payments", "k", `{}`)
			require.Equal(t, "true", dup.header.Get(ReplayedHeader))
			require.Equal(t, `{"ordered":true}`, dup.body)
		})
	}
}

// The same through Do, StoreErrors included: the error that says the run
// is kept is not stored as the call's result, and the retry resumes it.
func TestAnUnavailableErrorAfterAStepIsNotStored(t *testing.T) {
	m, _ := twoInstances(t)
	var charges, runs atomic.Int64
	fn := func(ctx context.Context) (int64, error) {
		n, err := Step(ctx, "charge", func(context.Context) (int64, error) { return charges.Add(1), nil })
		if err != nil {
			return 0, err
		}
		if runs.Add(1) == 1 {
			return 0, fmt.Errorf("%w: the database went away", ErrStoreUnavailable)
		}
		return n, nil
	}
	_, err := Do(context.Background(), m, Key{ID: "k"}, fn, Resumable(), StoreErrors())
	require.ErrorIs(t, err, ErrInProgress)
	require.NotErrorIs(t, err, ErrStoreUnavailable)
	got, err := Do(context.Background(), m, Key{ID: "k"}, fn, Resumable(), StoreErrors())
	require.NoError(t, err)
	require.EqualValues(t, 1, got)
	require.EqualValues(t, 1, charges.Load())
	require.EqualValues(t, 2, runs.Load())
}

// A run that resumes another resumes whatever that one began: here the
// first run panicked inside its charge, after the charge took effect and
// before its result was journaled. The resumed run, answering "not
// executed" before its own first step (its database went away), would send
// the client off to start over with a new key and be charged twice: it
// answers in-progress instead, and the key is kept for the next retry.
func TestAResumedRunNeverAnswersNotExecuted(t *testing.T) {
	s := newShop(t, WithResume(), WithLogger(slog.New(slog.DiscardHandler)))
	var charges, runs atomic.Int64
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		switch runs.Add(1) {
		case 1:
			Step(r.Context(), "charge", func(context.Context) (int64, error) {
				charges.Add(1)
				panic("the process dies mid-charge")
			})
		case 2:
			WriteError(w, r, fmt.Errorf("%w: the database went away", ErrStoreUnavailable))
			return
		}
		n, err := Step(r.Context(), "charge", func(context.Context) (int64, error) { return charges.Add(1), nil })
		if err != nil {
			WriteError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charges":%d}`, n)
	}
	c := s.client()
	s.postDropped("/payments", "k", `{}`)
	second := s.post(c, "/payments", "k", `{}`)
	require.NotEqual(t, http.StatusServiceUnavailable, second.status, "a resumed run said not executed: %s", second.body)
	requireProblem(t, second, http.StatusConflict, "in-progress")
	third := s.post(c, "/payments", "k", `{}`)
	require.Equal(t, http.StatusCreated, third.status, third.body)
	require.EqualValues(t, 3, runs.Load())
}

// A handler whose step found the key another execution's answers the error
// through WriteError: the client is told in-progress (its retry gets the
// other execution's answer), never an internal error, and the answer is not
// the key's.
func TestALostLockIsAnsweredInProgress(t *testing.T) {
	s := newShop(t, WithLogger(slog.New(slog.DiscardHandler)))
	s.handler = func(w http.ResponseWriter, r *http.Request) {
		if s.execs.Load() == 1 {
			WriteError(w, r, fmt.Errorf("charging: %w", ErrLockLost))
			return
		}
		s.defaultHandler(w, r)
	}
	c := s.client()
	requireProblem(t, s.post(c, "/payments", "k", `{}`), http.StatusConflict, "in-progress")
	require.Equal(t, http.StatusCreated, s.post(c, "/payments", "k", `{}`).status, "the 409 was not stored")
}
