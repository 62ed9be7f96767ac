package idempotency

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// awaitReplicas holds a fresh claim until enough replicas have it
// (WithReplicaAcks). A claim that only the primary holds is lost when the
// primary dies before replicating it, and the promoted replica would let a
// retry run the handler again; so too few acknowledgements fail closed.
func (m *Middleware) awaitReplicas(c *call, k keys) error {
	if m.cfg.replicaAcks == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.r.Context()), m.cfg.replicaWait+m.cfg.storeTimeout)
	defer cancel()
	node, err := m.store.nodeFor(ctx, k.record)
	if err != nil {
		return unavailable(err)
	}
	acked, err := node.Wait(ctx, m.cfg.replicaAcks, m.cfg.replicaWait).Result()
	if err != nil {
		return unavailable(err)
	}
	if acked < int64(m.cfg.replicaAcks) {
		return unavailable(fmt.Errorf("%d of %d replicas acknowledged the claim", acked, m.cfg.replicaAcks))
	}
	return nil
}

// waitCmder is the client method behind Redis WAIT, which go-redis leaves
// out of its Cmdable interface.
type waitCmder interface {
	Wait(ctx context.Context, numReplicas int, timeout time.Duration) *redis.IntCmd
}

// nodeFor returns a client for the primary that holds key: WAIT has no key,
// so a cluster client would send it to any node.
func (s *store) nodeFor(ctx context.Context, key string) (waitCmder, error) {
	if cluster, ok := s.client.(*redis.ClusterClient); ok {
		return cluster.MasterForKey(ctx, key)
	}
	if w, ok := s.client.(waitCmder); ok {
		return w, nil
	}
	return nil, fmt.Errorf("%T cannot send WAIT", s.client)
}
