package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceonly/idempotency/internal/keyspace"
	"github.com/onceonly/idempotency/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// -cluster takes the node list or a URL, which alone can carry a user and
// a password.
func TestCluster(t *testing.T) {
	prefix := "idemctl-TestCluster"
	c := redistest.Cluster(t, prefix)
	addrs := redistest.ClusterAddrs(t)
	ctx := t.Context()
	rec := prefix + ":{kClustered}:r"
	now, err := c.Time(ctx).Result()
	must(t, err)
	must(t, c.Set(ctx, rec, keyspace.Record{State: "run", Fingerprint: "x", Owner: "an-executor-that-died",
		Fence: strconv.FormatInt(now.Add(-5*time.Minute).UnixMicro(), 10), Executions: "1"}.String(), time.Hour).Err())

	url := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	user := ""
	// A user of our own only on a cluster this test binary started:
	// REDIS_CLUSTER_ADDRS may name someone else's.
	if os.Getenv("REDIS_CLUSTER_ADDRS") == "" {
		must(t, c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			return n.Do(ctx, "ACL", "SETUSER", "idemctl-ops", "on", ">s3cret", "~*", "&*", "+@all").Err()
		}))
		t.Cleanup(func() {
			c.ForEachShard(context.Background(), func(ctx context.Context, n *redis.Client) error {
				return n.Do(ctx, "ACL", "DELUSER", "idemctl-ops").Err()
			})
		})
		user = "idemctl-ops:s3cret@"
		url = "redis://" + user + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	}
	for _, cluster := range []string{strings.Join(addrs, ","), url} {
		r := runBinary(t, "", "-cluster", cluster, "-prefix", prefix, "show", rec)
		expect(t, r, 0, "key          "+rec, "run, interrupted", "claimed      5m")
		expect(t, runBinary(t, "", "-cluster", cluster, "-prefix", prefix, "interrupted"), 0, rec+"  fence=", "age=5m")
	}
	if user != "" {
		wrong := strings.Replace(url, "s3cret", "wrong", 1)
		r := runBinary(t, "", "-cluster", wrong, "-prefix", prefix, "show", rec)
		if r.code != 1 || !strings.Contains(r.stderr, "WRONGPASS") {
			t.Errorf("a wrong password: exit %d, %q", r.code, r.stderr)
		}
	}
	expect(t, runBinary(t, "", "-cluster", url, "-prefix", prefix, "resolve", "-forget", "-yes", rec), 0, "Forgotten: "+rec)
}
