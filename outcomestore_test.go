package idempotency

import (
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeOutcomes is an OutcomeStore that answers what a test sets.
type fakeOutcomes struct {
	mu        sync.Mutex
	answer    *Answer
	err       error
	recovered []uint64 // the fences Recover was called with
}

func (f *fakeOutcomes) Recover(_ context.Context, _ string, fence uint64) (Answer, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recovered = append(f.recovered, fence)
	if f.answer == nil {
		return Answer{}, false, f.err
	}
	return *f.answer, true, f.err
}

// abandonedPayment leaves key "k" of /payments claimed by an executor that
// stopped before it stored an answer, and returns its fingerprint in hex.
func abandonedPayment(t *testing.T, s *shop) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/payments", strings.NewReader(`{}`))
	fp := (&config{}).fingerprint(req, []byte(`{}`), true)
	crashAfterClaim(t, s, clientKeys(s.idem.cfg.prefix, paymentID("k")), fp.text())
	return hex.EncodeToString(fp[:])
}

func TestRecoveryFromAnOutcomeStore(t *testing.T) {
	t.Run("committed answer replayed and stored", func(t *testing.T) {
		outcomes := &fakeOutcomes{}
		s := newShop(t, WithLockLease(100*time.Millisecond), WithOutcomeStore(outcomes), WithResponseCache(0, 0))
		fp := abandonedPayment(t, s)
		outcomes.answer = &Answer{Status: 201, Body: []byte(`{"paid":true}`), Fingerprint: fp,
			Header: http.Header{"Location": {"/payments/7"}, "Set-Cookie": {"a=b"}}}
		for range 2 { // recovered, then replayed from Redis
			a := s.post(s.client(), "/payments", "k", `{}`)
			require.Equal(t, 201, a.status)
			require.Equal(t, `{"paid":true}`, a.body)
			require.Equal(t, "true", a.header.Get(ReplayedHeader))
			require.Equal(t, "/payments/7", a.header.Get("Location"))
			require.Empty(t, a.header.Get("Set-Cookie"), "a cookie is never replayed")
		}
		require.Zero(t, s.execs.Load())
		require.Len(t, outcomes.recovered, 1, "the second duplicate found the answer in Redis")
	})
	t.Run("nothing committed runs again under a higher fence", func(t *testing.T) {
		outcomes := &fakeOutcomes{}
		s := newShop(t, WithLockLease(100*time.Millisecond), WithOutcomeStore(outcomes))
		abandonedPayment(t, s)
		var fence uint64
		s.handler = func(w http.ResponseWriter, r *http.Request) {
			fence = FencingToken(r.Context())
			w.WriteHeader(201)
		}
		require.Equal(t, 201, s.post(s.client(), "/payments", "k", `{}`).status)
		require.EqualValues(t, 1, s.execs.Load())
		require.Equal(t, []uint64{fence}, outcomes.recovered, "recovered under the fence the handler ran with")
	})
	t.Run("store failure answers 409 in-progress and a retry recovers", func(t *testing.T) {
		outcomes := &fakeOutcomes{err: errors.New("database down")}
		s := newShop(t, WithLockLease(100*time.Millisecond), WithOutcomeStore(outcomes))
		fp := abandonedPayment(t, s)
		// Not 503 store-unavailable, which says nothing ran: it may have.
		requireProblem(t, s.post(s.client(), "/payments", "k", `{}`), 409, "in-progress")
		outcomes.mu.Lock()
		outcomes.err, outcomes.answer = nil, &Answer{Status: 201, Body: []byte("ok"), Fingerprint: fp}
		outcomes.mu.Unlock()
		a := s.post(s.client(), "/payments", "k", `{}`)
		require.Equal(t, 201, a.status)
		require.Equal(t, "ok", a.body)
		require.Zero(t, s.execs.Load())
	})
	t.Run("another request's answer is refused", func(t *testing.T) {
		outcomes := &fakeOutcomes{}
		s := newShop(t, WithLockLease(100*time.Millisecond), WithOutcomeStore(outcomes))
		abandonedPayment(t, s)
		outcomes.answer = &Answer{Status: 201, Fingerprint: strings.Repeat("0", 64)}
		requireProblem(t, s.post(s.client(), "/payments", "k", `{}`), 422, "key-reused")
		require.Zero(t, s.execs.Load())
	})
}

// go-redis resends a pipeline whose reply was lost: a resent takeover
// claim must still say it took the execution over, or recovery is skipped.
func TestResentTakeoverSaysRetaken(t *testing.T) {
	s := newShop(t, WithLockLease(100*time.Millisecond), WithOutcomeStore(&fakeOutcomes{}))
	ctx := t.Context()
	fp := abandonedPayment(t, s)
	k := clientKeys(s.idem.cfg.prefix, paymentID("k"))
	lock, err := newTestLock()
	require.NoError(t, err)
	for range 2 {
		c, err := s.idem.redis.claim(ctx, k, lock.Value(), fp)
		require.NoError(t, err)
		require.Equal(t, outcomeClaimed, c.outcome)
		require.True(t, c.retaken)
	}
}

// A committed answer over WithMaxResponseBytes is treated as one recorded
// over it: executed, not replayed.
func TestRecoveredAnswerOverTheLimit(t *testing.T) {
	outcomes := &fakeOutcomes{}
	s := newShop(t, WithLockLease(100*time.Millisecond), WithOutcomeStore(outcomes), WithMaxResponseBytes(8))
	fp := abandonedPayment(t, s)
	outcomes.answer = &Answer{Status: 201, Body: []byte("0123456789"), Fingerprint: fp}
	requireProblem(t, s.post(s.client(), "/payments", "k", `{}`), 409, "not-replayable")
	requireProblem(t, s.post(s.client(), "/payments", "k", `{}`), 409, "not-replayable")
	require.Zero(t, s.execs.Load())
}

// An answer the store committed as not replayable (too large for it to
// keep) is recovered as executed, not replayed, however short its body.
func TestRecoveredAnswerNotReplayable(t *testing.T) {
	outcomes := &fakeOutcomes{}
	s := newShop(t, WithLockLease(100*time.Millisecond), WithOutcomeStore(outcomes))
	fp := abandonedPayment(t, s)
	outcomes.answer = &Answer{Status: 201, Fingerprint: fp, NotReplayable: true}
	requireProblem(t, s.post(s.client(), "/payments", "k", `{}`), 409, "not-replayable")
	requireProblem(t, s.post(s.client(), "/payments", "k", `{}`), 409, "not-replayable")
	require.Zero(t, s.execs.Load())
	require.Len(t, outcomes.recovered, 1, "stored in Redis as executed, not replayable")
}
