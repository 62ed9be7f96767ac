package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// claimReplicated claims the key and, when the claim succeeds, holds it
// until enough replicas have it (WithReplicaAcks). A claim that only the
// primary holds is lost when the primary dies before replicating it, and
// the promoted replica would let a retry run the handler again; so too few
// acknowledgements are an error, and the caller undoes the claim.
//
// WAIT counts acknowledgements of the writes made on its own connection,
// so the claim and the WAIT share one connection to the key's primary.
//
// The lease is renewed during the wait, and the wait is shorter than a lease
// (New refuses it otherwise), so the original still owns the key when its
// handler starts.
func (m *Middleware) claimReplicated(ctx context.Context, c *call, l *lease) (claim, error) {
	primary, err := m.redis.primaryFor(ctx, l.k.record)
	if err != nil {
		return claim{}, err
	}
	conn := primary.Conn()
	var ends []func() // of the clients made for a redirection, after conn
	defer func() {
		conn.Close()
		for _, end := range ends {
			end()
		}
	}()
	cl, err := m.redis.claimOn(ctx, conn, l.k, l.lockValue, l.fpText)
	// During a reshard the slot's keys move to another master: MOVED when
	// the slot has moved (this client's map is behind), ASK while it is
	// moving and the keys are not here, TRYAGAIN while the claim's two keys
	// are not together on one master (one moved, or one not made yet: the
	// lock of a key that is not running). The claim follows, on a
	// connection to the master that answers, so that WAIT still counts the
	// claim's replicas; TRYAGAIN it waits out, within its step's time.
	asking := false
	for redirects := 0; err != nil; {
		kind, addr := redirection(err)
		switch kind {
		case "TRYAGAIN": // the migration moves the rest, or ends, soon
			if !awaitMigration(ctx) {
				return claim{}, err
			}
		case "MOVED", "ASK":
			if redirects++; redirects > maxRedirects {
				return claim{}, err
			}
			var end func()
			if primary, end, err = m.redis.masterAt(ctx, primary, addr); err != nil {
				return claim{}, err
			}
			ends = append(ends, end)
			conn.Close()
			conn, asking = primary.Conn(), kind == "ASK"
		default:
			return claim{}, err
		}
		cl, err = m.redis.claimRedirected(ctx, conn, l, asking)
	}
	if err != nil || cl.outcome != outcomeClaimed {
		return cl, err
	}
	l.watch() // the lock is renewed while the replicas are waited for
	wctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), m.cfg.replicaWait+m.cfg.storeTimeout)
	defer cancel()
	acked, err := conn.Wait(wctx, m.cfg.replicaAcks, m.cfg.replicaWait).Result()
	if err != nil {
		return claim{}, err
	}
	if acked < int64(m.cfg.replicaAcks) {
		return claim{}, fmt.Errorf("%w: %d of %d", errTooFewReplicas, acked, m.cfg.replicaAcks)
	}
	return cl, nil
}

// maxRedirects bounds how often one claim follows MOVED and ASK: a slot
// moves once, and a map that is behind is corrected by one MOVED.
const maxRedirects = 16

// errTooFewReplicas: the claim is on the primary, which answers, but not on
// enough replicas.
var errTooFewReplicas = errors.New("too few replicas acknowledged the claim")

// claimRedirected runs the claim again on conn. After ASK the master
// answers for the slot only to a command that follows ASKING, so the
// script is loaded first: its EVALSHA must not meet NOSCRIPT and be resent
// as an EVAL that comes without ASKING.
func (s *redisStore) claimRedirected(ctx context.Context, conn *redis.Conn, l *lease, asking bool) (claim, error) {
	if asking {
		if err := claimScript.Load(ctx, conn).Err(); err != nil {
			return claim{}, err
		}
		if err := conn.Do(ctx, "asking").Err(); err != nil {
			return claim{}, err
		}
	}
	return s.claimOn(ctx, conn, l.k, l.lockValue, l.fpText)
}

// redirection reads a Cluster's MOVED, ASK or TRYAGAIN error: its kind,
// and the master to ask instead.
func redirection(err error) (kind, addr string) {
	if err == nil {
		return "", "" // before redisErr, which escapes: no allocation per claim
	}
	var redisErr redis.Error
	if !errors.As(err, &redisErr) {
		return "", ""
	}
	kind, rest, _ := strings.Cut(redisErr.Error(), " ")
	_, addr, _ = strings.Cut(rest, " ") // MOVED and ASK: "<slot> <host:port>"
	if (kind == "MOVED" || kind == "ASK") && addr == "" {
		return "", ""
	}
	return kind, addr
}

// primaryFor returns a client for the primary that holds key, whose
// connections the claim and its WAIT can share.
func (s *redisStore) primaryFor(ctx context.Context, key string) (*redis.Client, error) {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *redis.Client:
		return c, nil
	}
	return nil, unsupportedForReplicaAcks(s.client)
}

// masterAt returns a client for the Cluster's master at addr, named by a
// redirection, and what ends it. Listing the masters reloads the slot map,
// so that the next claim goes to the right master at once. A master this
// client names otherwise (a hostname for an IP) gets a client of its own
// for this claim, with the options of the master that redirected.
func (s *redisStore) masterAt(ctx context.Context, from *redis.Client, addr string) (*redis.Client, func(), error) {
	cluster, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return nil, nil, fmt.Errorf("a redirection to %s from a client that is not a Cluster's", addr)
	}
	var mu sync.Mutex
	var found *redis.Client
	err := cluster.ForEachMaster(ctx, func(_ context.Context, master *redis.Client) error {
		if master.Options().Addr == addr {
			mu.Lock()
			found = master
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if found != nil {
		return found, func() {}, nil
	}
	opts := *from.Options()
	opts.Addr = addr
	own := redis.NewClient(&opts)
	return own, func() { own.Close() }, nil
}

// mustSupportReplicaAcks refuses, at start-up, a client whose claim WAIT
// cannot follow: WAIT counts the writes of its own connection, so the
// claim must go over a connection to the key's primary, which only a
// plain (or Sentinel) client and a Cluster client can give. A Ring would
// fail every claim.
func mustSupportReplicaAcks(client redis.UniversalClient) {
	switch client.(type) {
	case *redis.Client, *redis.ClusterClient:
		return
	}
	panic("idempotency: " + unsupportedForReplicaAcks(client).Error())
}

func unsupportedForReplicaAcks(client redis.UniversalClient) error {
	return fmt.Errorf("WithReplicaAcks needs a *redis.Client (plain or Sentinel) or a *redis.ClusterClient, not %T", client)
}
