package idempotency

import (
	"context"
	"errors"
	"fmt"

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
	primary, err := m.store.primaryFor(ctx, l.k.record)
	if err != nil {
		return claim{}, err
	}
	conn := primary.Conn()
	defer conn.Close()
	cl, err := m.store.claimOn(ctx, conn, l.k, l.token, l.fpText)
	if err != nil || cl.outcome != outcomeClaimed {
		return cl, err
	}
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

// errTooFewReplicas: the claim is on the primary, which answers, but not on
// enough replicas.
var errTooFewReplicas = errors.New("too few replicas acknowledged the claim")

// primaryFor returns a client for the primary that holds key, whose
// connections the claim and its WAIT can share.
func (s *store) primaryFor(ctx context.Context, key string) (*redis.Client, error) {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *redis.Client:
		return c, nil
	}
	return nil, fmt.Errorf("WithReplicaAcks needs a *redis.Client or *redis.ClusterClient, not %T", s.client)
}
