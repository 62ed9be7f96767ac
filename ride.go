package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/base64"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
)

// The claim rides with the lock. Taking the key's lock and claiming the key
// are two scripts, and sent one after the other they cost two round trips
// before the handler may start. Instead the claim goes out in the same
// pipeline as redislock's obtain script, right behind it: Redis runs the two
// in order, so the claim finds the lock ours exactly when the obtain took
// it. A first execution then costs two round trips (lock and claim, then the
// store of its answer), and a duplicate whose answer is stored costs one,
// even when the lock is held by someone else: claim.lua writes nothing
// without our lock, and what it reads of a finished record (the answer, a
// fingerprint that differs) decides the duplicate without the lock.
//
// The lock stays bsm/redislock's, with its own script and token rules; the
// rider only joins the round trip its Obtain makes, through the Scripter
// redislock is given.

// A claimRider is a claim waiting to ride with the next obtain script sent
// under its context.
type claimRider struct {
	keys  []string
	args  []any
	reply *redis.Cmd // set once sent

	// What an obtain with a rider needs besides, made in the rider's one
	// allocation: the claim's ARGV, the fingerprint it names (args hold
	// pointers to it and to rode.value), redislock's options and what the
	// claim answered.
	argv [6]any
	fp   string
	opts redislock.Options
	rode rode
}

type riderKey struct{}

// ridingScripter is the redis.Scripter redislock talks to. A lock script
// sent under a context that carries a claimRider goes out in one pipeline
// with the claim; every other script, as redislock sends it.
type ridingScripter struct {
	redis.UniversalClient
}

func (s ridingScripter) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if rider := pendingRider(ctx); rider != nil {
		return s.ride(ctx, rider, "evalsha", sha, keys, args)
	}
	return s.UniversalClient.EvalSha(ctx, sha, keys, args...)
}

// Eval is redislock's way in when the server lacked its script (NOSCRIPT).
func (s ridingScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if rider := pendingRider(ctx); rider != nil {
		return s.ride(ctx, rider, "eval", script, keys, args)
	}
	return s.UniversalClient.Eval(ctx, script, keys, args...)
}

func pendingRider(ctx context.Context) *claimRider {
	rider, _ := ctx.Value(riderKey{}).(*claimRider)
	if rider == nil || rider.reply != nil {
		return nil // a rider goes once; a resend of the lock goes alone
	}
	return rider
}

// ride sends the lock script (name is evalsha or eval) with the claim
// right behind it.
func (s ridingScripter) ride(ctx context.Context, rider *claimRider, name, script string, keys []string, args []any) *redis.Cmd {
	var lock *redis.Cmd
	pipe := s.Pipeline()
	if name == "eval" {
		lock = pipe.Eval(ctx, script, keys, args...)
	} else {
		lock = pipe.EvalSha(ctx, script, keys, args...)
	}
	rider.reply = pipe.EvalSha(ctx, claimScript.Hash(), rider.keys, rider.args...)
	pipe.Exec(ctx) // each command carries its own reply or error
	if isNoScript(lock.Err()) {
		// The server lacked the lock script, so the claim ran without the
		// lock and its reply means nothing. redislock sends the script
		// itself next (Eval): the claim rides again with it.
		rider.reply = nil
	}
	return lock
}

// rode is the claim that rode with an obtain.
type rode struct {
	value string // the lock value the claim ran with
	claim claim
	err   error // the claim's own failure; its reply was lost or refused
}

// obtainClaiming obtains the key's lock with the claim riding along. The
// returned rode is nil when the claim was not sent or cannot be used (a
// NOSCRIPT): then, holding the lock, the caller claims alone. A rode with an
// error may belong to a pipeline that never reached Redis: go-redis keeps
// dialling until the context ends, so the error cannot tell.
func (s *store) obtainClaiming(ctx context.Context, k keys, fingerprint string) (*redislock.Lock, *rode, error) {
	value, err := lockToken()
	if err != nil {
		return nil, nil, err
	}
	rider := &claimRider{keys: k.redisKeys(), fp: fingerprint, opts: redislock.Options{Token: value}}
	rider.rode.value = value
	rider.args = s.claimArgsIn(&rider.argv, k, &rider.rode.value, &rider.fp)
	lock, err := s.locks.Obtain(context.WithValue(ctx, riderKey{}, rider), k.lock, s.cfg.lease, &rider.opts)
	if rider.reply == nil {
		return lock, nil, err
	}
	if isNoScript(rider.reply.Err()) {
		// The server lost its scripts (a restart, SCRIPT FLUSH). The claim
		// never ran; load it for next time, and claim alone now if the lock
		// is ours.
		claimScript.Load(ctx, s.client)
		return lock, nil, err
	}
	r := &rider.rode
	r.claim, r.err = s.claimReply(k, rider.reply)
	return lock, r, err
}

// isNoScript reports whether err is Redis's NOSCRIPT. It asks go-redis
// only about an error: HasErrorPrefix allocates even for nil.
func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// lockToken is a lock value as redislock makes its own: 16 random bytes,
// base64url. We make it so that the claim can name it before the lock is
// known to be ours.
func lockToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// decisive reports whether a claim's outcome answers the request even
// though the lock was someone else's: every outcome read from a finished
// record, or from a token set, which only a claim under the lock changes.
// outcomeLost (the key is running, or about to) is no answer: wait.
func decisive(o claimOutcome) bool {
	switch o {
	case outcomeDone, outcomeMismatch, outcomeBig, outcomeUnreadable, outcomeUnknown, outcomeAbandoned:
		return true
	}
	return false
}
