package idempotency

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/onceonly/idempotency/internal/redistest"
)

// Whether a token has expired is the store's to say, on the one clock that
// every instance's claims of it meet. A submission sent with life left
// whose claim reaches Redis after the token expired (behind a slow link)
// is refused as expired, as a later double click on another instance was:
// "token-expired" means nothing ran and nothing will.
func TestATokenClaimLandingAfterItsExpiryIsNotSpent(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	srv := redistest.Private(t)
	s := newShopOn(t, srv.Client(t), WithKeyPrefix("expiry"), WithTokenTTL(ttl))
	proxy := redistest.NewProxy(t, srv.Addr())
	slow := newShopOn(t, clientTo(t, proxy.Addr()), WithKeyPrefix("expiry"), WithTokenTTL(ttl),
		WithStoreTimeout(3*time.Second))

	c := s.client()
	tok := s.token(c)
	issued := time.Now() // the token expires ttl after a moment before this one
	time.Sleep(time.Until(issued.Add(ttl - 300*time.Millisecond)))
	proxy.HoldCommand(tok, 700*time.Millisecond) // its claim lands 400 ms after the expiry
	first := make(chan answer)
	go func() { first <- slow.post(c, "/orders", tok, `{}`) }()

	time.Sleep(time.Until(issued.Add(ttl + 100*time.Millisecond)))
	requireProblem(t, s.post(c, "/orders", tok, `{}`), 422, "token-expired")
	requireProblem(t, <-first, 422, "token-expired")
	requireProblem(t, s.post(c, "/orders", tok, `{}`), 422, "token-expired")
	require.Zero(t, s.execs.Load()+slow.execs.Load(), "a token answered as expired never runs")
}
