package redistest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	clusterOnce  sync.Once
	clusterAddrs []string
	clusterErr   error
)

// Cluster returns a client for a 3-master Redis Cluster: REDIS_CLUSTER_ADDRS
// when set, else one this package starts on loopback (once per test binary).
// Keys under prefix are deleted when the test ends. Without redis-server the
// test is skipped, unless real Redis is required.
func Cluster(t testing.TB, prefix string) *redis.ClusterClient {
	t.Helper()
	clusterOnce.Do(func() {
		if raw := os.Getenv("REDIS_CLUSTER_ADDRS"); raw != "" {
			clusterAddrs = strings.Split(raw, ",")
			return
		}
		if _, err := exec.LookPath(ServerCommand()); err != nil {
			return
		}
		clusterAddrs, clusterErr = startCluster(3)
	})
	if clusterErr != nil {
		t.Fatalf("redistest: %v", clusterErr)
	}
	if clusterAddrs == nil {
		requireOrSkip(t, ServerCommand()+" is not on PATH, so no cluster")
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: clusterAddrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() {
		DeletePrefix(t, c, prefix)
		c.Close()
	})
	return c
}

// ClusterAddrs starts (or finds) the cluster and returns its node addresses.
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	Cluster(t, "redistest-unused:")
	return clusterAddrs
}

// PrivateCluster starts a Redis Cluster that only this test uses (one whose
// slots it may move): masters, each with replicas, stopped when the test
// ends. It returns every node's address. redis-cli wants 3 masters at least.
func PrivateCluster(t testing.TB, masters, replicas int) []string {
	t.Helper()
	if _, err := exec.LookPath(ServerCommand()); err != nil {
		requireOrSkip(t, ServerCommand()+" is not on PATH, so no cluster")
	}
	var servers []*Server
	t.Cleanup(func() {
		for _, s := range servers {
			s.Stop()
		}
	})
	addrs, err := startClusterOf(masters, replicas, func(s *Server) { servers = append(servers, s) })
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return addrs
}

// startCluster starts n cluster-enabled servers and joins them as masters.
func startCluster(n int) ([]string, error) {
	return startClusterOf(n, 0, func(*Server) {})
}

// startClusterOf starts masters*(1+replicas) cluster-enabled servers and
// joins them, handing each server to started. A node's bus listens on its
// port + 10000, so ports stay at or below 55535.
func startClusterOf(masters, replicas int, started func(*Server)) ([]string, error) {
	var addrs []string
	for len(addrs) < masters*(1+replicas) {
		port, err := clusterPort()
		if err != nil {
			return nil, err
		}
		s, err := startOnPort(port, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		if err != nil {
			return nil, err
		}
		started(s)
		addrs = append(addrs, s.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	return addrs, waitClusterOK(addrs, 20*time.Second)
}

func waitClusterOK(addrs []string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				return fmt.Errorf("cluster node %s not ready: %v %q", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return nil
}

// clusterPort finds a port whose bus port (+10000) is free as well.
func clusterPort() (int, error) {
	for range 200 {
		port := 20000 + rand.IntN(55535-20000)
		if free(port) && free(port+10000) {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no free port pair for a cluster node")
}

func free(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
