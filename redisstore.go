package idempotency

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceonly/idempotency/internal/keyspace"
)

var (
	//go:embed lua/claim.lua
	claimSource string
	//go:embed lua/complete.lua
	completeSource string
	//go:embed lua/release.lua
	releaseSource string
	//go:embed lua/keep.lua
	keepSource string
	//go:embed lua/renew.lua
	renewSource string
	//go:embed lua/unlock.lua
	unlockSource string
	//go:embed lua/step.lua
	stepSource string

	claimScript    = keyspace.RecordScript(claimSource)
	completeScript = keyspace.RecordScript(completeSource)
	releaseScript  = keyspace.RecordScript(releaseSource)
	keepScript     = keyspace.RecordScript(keepSource)
	renewScript    = keyspace.RecordScript(renewSource)
	unlockScript   = redis.NewScript(unlockSource)
	stepScript     = keyspace.RecordScript(stepSource)
)

// redisStore is the Redis side of the middleware. Each method is one
// script and one round trip (two the first time a script meets a server
// that lacks it), and is safe to repeat: go-redis resends a command whose
// reply was lost, so every script answers a repeat the way it answered the
// original.
//
// The key's lease is a lock key holding a random value for a lease, owned
// by these scripts alone: claim.lua takes it as it claims, renew.lua
// renews it (and takes a lapsed one back), and complete.lua, release.lua,
// keep.lua and unlock.lua let it go.
type redisStore struct {
	client redis.UniversalClient
	cfg    *config
	waits  *waitRoom // every cross-instance wait, on one connection
	// Script arguments that never change, boxed once instead of per call.
	recordTTL, retryAbandoned, horizon, lease any
}

func newRedisStore(client redis.UniversalClient, cfg *config) *redisStore {
	retry := "0"
	if cfg.takeover() {
		retry = "1"
	}
	return &redisStore{
		client: client, cfg: cfg,
		waits:     &waitRoom{client: client, timeout: cfg.storeTimeout},
		recordTTL: cfg.recordTTL.Milliseconds(), retryAbandoned: retry,
		horizon: cfg.claimHorizon().Milliseconds(), lease: cfg.lease.Milliseconds(),
	}
}

// claimOutcome is what claim decided.
type claimOutcome int

const (
	outcomeClaimed    claimOutcome = iota // run the handler
	outcomeDone                           // replay rec
	outcomeUnknown                        // a token whose record an operator forgot
	outcomeMismatch                       // key used before for a different request
	outcomeBig                            // executed, response not replayable
	outcomeAbandoned                      // claimed by an executor that vanished
	outcomeHeld                           // another executor holds the key's lock: wait
	outcomeUnreadable                     // executed, stored answer cannot be decoded
	outcomeRunning                        // its lock lapsed, but its executor may still store
	outcomeExpired                        // token expired, never spent
)

type claim struct {
	outcome claimOutcome
	fence   uint64 // outcomeClaimed only
	retaken bool   // outcomeClaimed: an abandoned execution taken over
	// journal is, once retaken, the steps the abandoned execution journaled
	// (a pointer: the claim rides in every request's allocation, and most
	// never take anything over).
	journal *string
	rec     *record // outcomeDone only
	// horizonIn is, for outcomeRunning, how long the executor whose lock
	// lapsed may still store: then the key reads interrupted, or is taken
	// over.
	horizonIn time.Duration
	// queued is how long the claim waited for a connection before its
	// first statement was sent (SQL): its lease began no sooner.
	queued time.Duration
}

// claim runs claim.lua, which takes the key's lock under lockValue (a fresh
// random value, newLockValue) when it claims. Only outcomeClaimed holds the
// lock.
//
// On a Cluster whose slot is migrating, Redis answers TRYAGAIN while the
// claim's two keys are not together on one master (the record moved and
// the lock not made yet, or the other way round); go-redis tries a few
// times, and the claim goes on trying, within ctx, until the slot has
// moved.
func (s *redisStore) claim(ctx context.Context, k keys, lockValue, fingerprint string) (claim, error) {
	for {
		cl, err := s.claimOn(ctx, s.client, k, lockValue, fingerprint)
		if kind, _ := redirection(err); kind != "TRYAGAIN" || !awaitMigration(ctx) {
			return cl, err
		}
	}
}

// awaitMigration pauses a claim that met TRYAGAIN before it tries again,
// and reports false when ctx ended first.
func awaitMigration(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(20 * time.Millisecond):
		return true
	}
}

// claimOn runs the claim through via: a dedicated connection when the claim
// must be followed by WAIT on the same connection.
func (s *redisStore) claimOn(ctx context.Context, via redis.Scripter, k keys, lockValue, fingerprint string) (claim, error) {
	return s.claimReply(k, claimScript.Run(ctx, via, k.redisKeys(), s.claimArgs(k, lockValue, fingerprint)...))
}

// claimArgs are claim.lua's ARGV. The lock value and the fingerprint may
// be strings or pointers to them (see complete).
func (s *redisStore) claimArgs(k keys, lockValue, fingerprint any) []any {
	token, life, abandoned, expires := s.cfg.claimTerms(k)
	issued, ttl, retry := argNotIssued, s.recordTTL, s.retryAbandoned
	switch token {
	case "t":
		issued = argIssued
	case "r":
		issued = argLookup
	}
	if life != s.cfg.recordTTL {
		ttl = life.Milliseconds()
	}
	if abandoned == "2" {
		retry = argResume
	}
	// Room for the token's expiry: one allocation either way (both sizes
	// are in one size class).
	args := append(make([]any, 0, 8), lockValue, fingerprint, ttl, issued, retry, s.horizon, s.lease)
	if expires != 0 {
		args = append(args, expires)
	}
	return args
}

// claimTerms are what a claim of k asks beyond its lock value and
// fingerprint (claim.lua's ARGV 3 to 5, and 8): how its token stands (""
// none, "t" issued, "r" lookup only), how long its record lives, what
// becomes of a run it finds abandoned ("0" refused, "1" taken over, "2"
// resumed once nothing can store for it), and when an issued token
// expires (Unix microseconds; 0 for none).
//
// Whether an issued token has expired is the store's to say, on its own
// clock, with the token's expiry: a claim judged on
// its instance's clock could be told "expired, nothing ran" while another
// instance's claim of the same token, sent in time, was still on its way
// to the store and then ran. ("x", a token its instance judged expired,
// is what instances of earlier versions send; the store still reads it.)
func (c *config) claimTerms(k keys) (token string, life time.Duration, abandoned string, expires int64) {
	life, abandoned = c.recordTTL, "0"
	if c.takeover() {
		abandoned = "1"
	}
	if k.token != "" {
		token = "t"
		if k.lookupOnly {
			token = "r"
		} else if !k.tokenExpires.IsZero() {
			expires = k.tokenExpires.UnixMicro()
		}
		life = max(life, k.lifetime(c.recordTTL))
	}
	if k.resume && !c.takeover() {
		abandoned = "2"
	}
	return token, life, abandoned, expires
}

// claimReply reads claim.lua's reply.
func (s *redisStore) claimReply(k keys, cmd *redis.Cmd) (claim, error) {
	reply, err := cmd.Slice()
	if err != nil {
		return claim{}, err
	}
	var f claimFound
	var text string
	if len(reply) > 0 {
		f.word, _ = reply[0].(string)
	}
	if len(reply) > 1 {
		text, _ = reply[1].(string)
	}
	switch f.word {
	case "claimed":
		f.fence, f.retaken = text, len(reply) > 2
		if len(reply) > 3 {
			f.journal, _ = reply[3].(string)
		}
	case "done":
		if len(reply) != 3 {
			f.word = "corrupt"
			break
		}
		f.record = text
		f.ttl, _ = reply[2].(int64)
	case "running":
		f.horizonIn, _ = strconv.ParseInt(text, 10, 64)
	}
	return f.read(s.cfg, k)
}

// unreadable is the claim of a key whose record cannot be read. The
// handler ran; what it answered is lost to us. Retrying cannot help, so
// this is no store failure.
func unreadableClaim(cfg *config, k keys, err error) claim {
	cfg.logger.Error("idempotency: stored answer cannot be decoded; duplicates get the "+
		"unreadable-record problem until the record expires", "key", k.record, "error", err)
	return claim{outcome: outcomeUnreadable}
}

// completion is what complete found when it stored an answer.
type completion int

const (
	completed completion = iota // stored
	rewritten                   // stored again: the record had vanished mid-run
)

// complete stores rec as the key's answer for ttl and releases the lock;
// rec == nil stores "executed, not replayable". It returns ErrLockLost when
// another executor owns the key now, and then writes nothing but the lock's
// release. It takes the lock value by pointer: go-redis writes a *string
// argument as its value, and a pointer to the lease's own field costs no
// allocation to pass as one, where a string would.
func (s *redisStore) complete(ctx context.Context, k keys, lockValue *string, fp string, fence uint64, rec *record, ttl time.Duration) (completion, error) {
	texts := newCompletionTexts(fp, *lockValue, fence, rec)
	life := s.recordTTL
	if ms := k.lifetime(ttl).Milliseconds(); ms != s.cfg.recordTTL.Milliseconds() {
		life = ms
	}
	stored, err := completeScript.Run(ctx, s.client, k.flagged(),
		lockValue, (*storedText)(texts), life, (*claimedText)(texts)).Int()
	switch {
	case err != nil:
		return 0, err
	case stored == 0:
		return 0, ErrLockLost
	case stored == 2:
		return rewritten, nil
	}
	return completed, nil
}

// Script arguments that are constants, boxed once.
var (
	argIssued, argLookup, argNotIssued, argResume any = "t", "r", "", "2"
	argRenewOnly, argRetake                       any = "0", "1"
)

// release undoes a claim: the record goes (which gives an issued token
// back), and the lock is freed. It does nothing to a record another
// executor owns.
func (s *redisStore) release(ctx context.Context, k keys, lockValue string) error {
	return releaseScript.Run(ctx, s.client, k.flagged(), lockValue).Err()
}

// keep ends a run whose outcome cannot be known: the record stays claimed,
// marked kept, so that claims read it interrupted at once, and the lock is
// freed.
func (s *redisStore) keep(ctx context.Context, k keys, lockValue string) error {
	return keepScript.Run(ctx, s.client, k.redisKeys(), lockValue).Err()
}

// renew extends the key's lock under lockValue by a lease, and reports
// whether it is still ours. With retake, a lock that lapsed is taken back
// when nobody holds it and the record still names a run under lockValue.
func (s *redisStore) renew(ctx context.Context, k keys, lockValue string, retake bool) (bool, error) {
	mode := argRenewOnly
	if retake {
		mode = argRetake
	}
	n, err := renewScript.Run(ctx, s.client, k.redisKeys(), lockValue, s.lease, mode).Int()
	return n == 1, err
}

// unlock lets the key's lock go if lockValue still holds it, and leaves the
// record as it is.
func (s *redisStore) unlock(ctx context.Context, k keys, lockValue string) error {
	return unlockScript.Run(ctx, s.client, k.lockKey(), lockValue).Err()
}

// A runProof is what step.lua found of a run: whether the key's record
// names it (owned 1; 0 another run or none; -1 no record at all), and how
// long its lock has left: until then nobody else can take the key over.
type runProof struct {
	owned int
	left  time.Duration
}

// journal appends entry to the journal of the run claimed under
// lockValue, where the journal is before bytes long, and says what it
// found of the run; an empty entry only proves the run's ownership.
// Nothing is written unless the record names that run.
func (s *redisStore) journal(ctx context.Context, k keys, lockValue string, entry []byte, before int) (runProof, error) {
	retake := ""
	if !s.cfg.takeover() {
		// Nobody else may take the key while the record names the run: a
		// lapsed lock is taken back, as the watchdog does (renew.lua).
		retake = strconv.FormatInt(s.cfg.lease.Milliseconds(), 10)
	}
	reply, err := stepScript.Run(ctx, s.client, k.redisKeys(), lockValue, entry, before, retake).Int64Slice()
	if err != nil {
		return runProof{}, err
	}
	if len(reply) != 2 {
		return runProof{}, errCorruptRecord
	}
	return runProof{owned: int(reply[0]), left: time.Duration(reply[1]) * time.Millisecond}, nil
}

// ping asks Redis for a PONG.
func (s *redisStore) ping(ctx context.Context) error { return s.client.Ping(ctx).Err() }

var errCorruptRecord = errors.New("idempotency: corrupt stored record")

// unavailable wraps a Redis failure so that errors.Is finds both the sentinel
// and the cause.
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
}

// neverSent reports whether err says that a command never reached Redis:
// the application closed the client. Nothing else says so for sure: a
// command whose connection broke is resent on a new one, and when that one
// cannot even connect (Redis refuses connections, or is gone), the dial's
// error is the one that comes back, although the first attempt may have
// reached Redis and run. An undo of a claim that failed otherwise is
// therefore always queued.
func neverSent(err error) bool {
	return errors.Is(err, redis.ErrClosed)
}
