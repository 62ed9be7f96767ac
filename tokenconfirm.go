package idempotency

import (
	"context"
	"crypto/hmac"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// A token is spent only under a secret the fleet keeps. An instance may
// hold a shared secret that Redis no longer does: Redis restarted without
// persistence, and the instance has not rechecked yet (tokensign.go). If it
// spent a token then, and another instance made a new secret before this
// one wrote its own back, and this one stopped before its recheck retired
// its secret in Redis, then no instance could ever check that token again:
// its resubmission would be told token-not-found although its record
// holds an answer, and the form would ask for a new token and run again.
//
// So a fresh claim of a token reads the secret Redis keeps, in the claim's
// own round trip (ride.go), and the handler starts only when it is the
// token's: kept, or written back now because Redis had none. When Redis
// keeps another, the fleet moved on while this instance held the old one:
// the claim is given back, nothing ran, and the token is answered as one of
// a retired secret that was never spent (token-not-found); this instance
// takes the fleet's secret before it answers (adopt). Records of tokens
// spent before a secret went are found through the retired secrets, as
// before.
//
// One record can outlive its secret still: Redis lost the record while the
// handler ran (a restart without persistence, after the claim's check), and
// the store wrote it back. Meanwhile another instance may have made a new
// secret, and this one may stop before a recheck retires its own; so the
// store that writes a token's record back also records the token's secret
// among the retired ones (keepFindable) before it counts as done.

var (
	// errSecretMoved: the token's secret is no longer the one Redis keeps.
	errSecretMoved = errors.New("idempotency: the token's secret is no longer the fleet's")
	// errShortSecret: Redis keeps a shared secret too short to sign with.
	errShortSecret = errors.New("idempotency: the shared token secret in Redis is shorter than 32 bytes")
	// errRefreshesWaiting: too many tokens that no secret here signed wait
	// for the next read of the fleet's secrets.
	errRefreshesWaiting = errors.New("idempotency: too many unknown tokens wait for the fleet's secrets")
)

// secretKey is where Redis keeps the shared secret.
func (s *tokenSigner) secretKey() string {
	return secretKey(s.prefix)
}

func secretKey(prefix string) string {
	return prefix + ":token-secret"
}

// put writes secret as the shared one where Redis keeps none: ours reports
// that it went in, and otherwise kept is the one another instance wrote
// meanwhile (SET NX … GET answers it, or nil when ours went in). A secret
// this instance held (writeBack) is logged as written back.
func (s *tokenSigner) put(ctx context.Context, secret []byte, writeBack bool) (kept []byte, ours bool, err error) {
	kept, err = s.client.SetArgs(ctx, s.secretKey(), secret, redis.SetArgs{Mode: "NX", Get: true}).Bytes()
	if !errors.Is(err, redis.Nil) {
		return kept, false, err
	}
	if writeBack {
		s.logger.Warn("idempotency: the shared token secret was missing from Redis (a restart without " +
			"persistence, an eviction or a delete); this instance wrote back the one it holds")
	}
	return nil, true, nil
}

// confirm makes sure Redis keeps secret, which signed a token whose claim
// just went in. read is the claim's reading of the secret (nil when the
// claim went alone: then it is read now). It returns errSecretMoved when
// Redis keeps another secret, and ErrStoreUnavailable when Redis cannot
// tell: in both cases the handler must not run.
func (s *tokenSigner) confirm(ctx context.Context, secret []byte, read *redis.StringCmd) error {
	if read == nil {
		read = s.client.Get(ctx, s.secretKey())
	}
	kept, err := read.Bytes()
	if errors.Is(err, redis.Nil) {
		var ours bool
		if kept, ours, err = s.put(ctx, secret, true); ours {
			return nil
		}
	}
	switch {
	case err != nil:
		return unavailable(err)
	case hmac.Equal(kept, secret):
		return nil
	}
	if len(kept) < minTokenSecret {
		// Not a secret anyone can sign with: an operator's mistake,
		// which the reload logs. Whether the fleet moved is unknown.
		s.reload()
		return unavailable(errShortSecret)
	}
	s.adopt(secret, kept)
	return errSecretMoved
}

// adopt makes kept, the secret Redis keeps in place of held, this
// instance's before the claim of held's token is answered: the answer
// (token-not-found) makes the form ask for a new token, and that one must
// be signed with the fleet's secret, or it would be refused in turn. held
// is retired, in Redis too, where the other instances that held it find it
// at their recheck; the reload that follows reads the fleet's retired
// secrets.
func (s *tokenSigner) adopt(held, kept []byte) {
	s.mu.Lock()
	moved := hmac.Equal(s.secret, held) // else a read already moved it
	if moved {
		s.use(kept, nil)
	}
	s.mu.Unlock()
	if moved {
		go s.retire(held)
	}
	s.reload()
}

// reload starts a read of the shared secret now, unless one is in flight
// or one failed within secretRetry.
func (s *tokenSigner) reload() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loading == nil && time.Since(s.failed) >= secretRetry {
		s.startLoad()
	}
}

// refresh reads the fleet's secrets (the shared one and the retired ones)
// for a token that none this instance holds signed, checked at since: the
// fleet may have moved to a secret this instance has not read yet, or
// retired one it never held. It reports whether the token is to be checked
// again, once a read that started after since has succeeded: at once when
// one already has, or else after the read it starts or joins (one shared by
// every caller, bounded by the store timeout, and ctx).
//
// Reads for such tokens start at most once per secretRetry, so that forged
// tokens cost Redis one read a second whatever their number: a caller that
// comes sooner waits for the next one, rather than be told token-not-found
// while its token's record exists (its form would ask for a new token and
// order again). At most maxRefreshWaiters wait, so that a flood of forged
// tokens holds little memory; beyond them, and when a read failed within
// secretRetry, it answers ErrStoreUnavailable (503, Retry-After), for the
// same reason. Under the application's own secret (WithTokenSecret), which
// cannot move, it reports false at once.
func (s *tokenSigner) refresh(ctx context.Context, since time.Time) (again bool, err error) {
	waiting := false
	defer func() {
		if waiting {
			s.waiters.Add(-1)
		}
	}()
	for {
		s.mu.Lock()
		var wait <-chan struct{}
		var limit time.Duration
		switch {
		case s.read.After(since):
			s.mu.Unlock()
			return true, nil
		case !s.shared:
			s.mu.Unlock()
			return false, nil
		case s.loading != nil: // maybe one that started before since
			wait = s.loading
		case time.Since(s.failed) < secretRetry:
			err := s.failure
			s.mu.Unlock()
			return false, err
		default:
			if limit = secretRetry - time.Since(s.refreshed); limit <= 0 {
				s.refreshed = time.Now()
				s.startLoad()
				wait = s.loading
			}
		}
		s.mu.Unlock()
		if !waiting {
			if s.waiters.Add(1) > maxRefreshWaiters {
				s.waiters.Add(-1)
				return false, unavailable(errRefreshesWaiting)
			}
			waiting = true
		}
		if err := sleepOn(ctx, wait, limit); err != nil {
			return false, err
		}
	}
}

// maxRefreshWaiters is how many requests may wait for a read of the fleet's
// secrets at once (refresh).
const maxRefreshWaiters = 256

// sleepOn waits for done, or for d when done is nil; it returns
// ErrStoreUnavailable when ctx ends first.
func sleepOn(ctx context.Context, done <-chan struct{}, d time.Duration) error {
	var elapsed <-chan time.Time
	if done == nil {
		timer := time.NewTimer(d)
		defer timer.Stop()
		elapsed = timer.C
	}
	select {
	case <-done:
	case <-elapsed:
	case <-ctx.Done():
		return unavailable(ctx.Err())
	}
	return nil
}
