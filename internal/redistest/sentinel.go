package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelSet is a primary, a replica of it and three Sentinels that
// monitor them, all private to one test, on loopback. The Sentinels judge
// the primary down after a second without an answer, and two of them
// agreeing is enough to fail over to the replica.
type SentinelSet struct {
	Name      string // the primary's name in the Sentinels' configuration
	Primary   *Server
	Replica   *Server
	Sentinels []*Server
}

// SentinelDownAfter is how long the Sentinels of a SentinelSet wait for a
// primary that does not answer before they judge it down.
const SentinelDownAfter = time.Second

// Sentinel starts a SentinelSet and returns once each Sentinel knows the
// replica and the other two Sentinels, and the replica acknowledges the
// primary's writes: from then on a failover can happen. Everything is
// stopped when t ends. Without a Sentinel program (SentinelCommand) the
// test is skipped, unless real Redis is required.
func Sentinel(t testing.TB) *SentinelSet {
	t.Helper()
	program, _ := SentinelCommand()
	if _, err := exec.LookPath(program); err != nil {
		requireOrSkip(t, program+" is not on PATH, so no Sentinel")
	}
	if _, err := exec.LookPath(ServerCommand()); err != nil {
		requireOrSkip(t, ServerCommand()+" is not on PATH, so no Sentinel")
	}
	set := &SentinelSet{Name: "idempotency"}
	var err error
	// Diskless sync at once: whichever server is primary, its replicas
	// sync without the default 5 s delay.
	if set.Primary, err = StartServer("--repl-diskless-sync-delay", "0"); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(set.Primary.Stop)
	if set.Replica, err = StartReplica(set.Primary.Addr()); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(set.Replica.Stop)
	for range 3 {
		s, err := startSentinel(set.Name, set.Primary.Addr())
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		t.Cleanup(s.Stop)
		set.Sentinels = append(set.Sentinels, s)
	}
	if err := set.awaitReady(30 * time.Second); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return set
}

// StartReplica starts a private server that replicates primary (host:port).
func StartReplica(primary string) (*Server, error) {
	host, port, err := net.SplitHostPort(primary)
	if err != nil {
		return nil, err
	}
	return StartServer("--replicaof", host, port, "--repl-diskless-sync-delay", "0")
}

// RestartAsReplica starts a new server on the port of s, which must have
// stopped (killed, say), as a replica of primary: what a supervisor does
// with a crashed primary once Sentinel has promoted another. It is stopped
// when t ends.
func RestartAsReplica(t testing.TB, s *Server, primary string) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(primary)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	_, own, _ := net.SplitHostPort(s.Addr())
	p, _ := strconv.Atoi(own)
	s.Stop()
	var again *Server
	for range 50 { // the old process may hold the port for a moment
		if again, err = startOnPort(p, "--replicaof", host, port, "--repl-diskless-sync-delay", "0"); err == nil {
			t.Cleanup(again.Stop)
			return again
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("redistest: restarting on port %d: %v", p, err)
	return nil
}

// startSentinel starts a Sentinel that monitors the primary at addr under
// name. Sentinel rewrites its config file, so the file lives in the
// Sentinel's own directory.
func startSentinel(name, primary string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	host, pport, err := net.SplitHostPort(primary)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-sentinel-")
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "sentinel.conf")
	ms := strconv.Itoa(int(SentinelDownAfter / time.Millisecond))
	lines := []string{
		"port " + strconv.Itoa(port),
		"bind 127.0.0.1",
		"daemonize no",
		"dir " + dir,
		"logfile " + filepath.Join(dir, "redis.log"),
		fmt.Sprintf("sentinel monitor %s %s %s 2", name, host, pport),
		fmt.Sprintf("sentinel down-after-milliseconds %s %s", name, ms),
		// A failover that stalls is tried again after twice this.
		fmt.Sprintf("sentinel failover-timeout %s 10000", name),
	}
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	program, sentinelMode := SentinelCommand()
	argv := []string{conf}
	if sentinelMode {
		argv = append(argv, "--sentinel")
	}
	return start(program, port, dir, argv)
}

// Addrs are the Sentinels' addresses.
func (s *SentinelSet) Addrs() []string {
	var addrs []string
	for _, sn := range s.Sentinels {
		addrs = append(addrs, sn.Addr())
	}
	return addrs
}

// Client returns a go-redis FailoverClient: it asks the Sentinels for the
// primary and follows them when they fail over. It is closed when t ends.
func (s *SentinelSet) Client(t testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            s.Name,
		SentinelAddrs:         s.Addrs(),
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// Master is the primary's address as the Sentinels name it, when a
// majority of them agree.
func (s *SentinelSet) Master(ctx context.Context) (string, error) {
	votes := map[string]int{}
	for _, sn := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
		addr, err := c.GetMasterAddrByName(ctx, s.Name).Result()
		c.Close()
		if err == nil && len(addr) == 2 {
			votes[net.JoinHostPort(addr[0], addr[1])]++
		}
	}
	for addr, n := range votes {
		if n > len(s.Sentinels)/2 {
			return addr, nil
		}
	}
	return "", fmt.Errorf("no majority of the Sentinels names a primary: %v", votes)
}

// AwaitFailover waits until a majority of the Sentinels names a primary
// other than old, and that server answers as a primary; it returns its
// address.
func (s *SentinelSet) AwaitFailover(ctx context.Context, old string) (string, error) {
	for {
		if addr, err := s.Master(ctx); err == nil && addr != old {
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
			role, err := c.Do(ctx, "ROLE").Slice()
			c.Close()
			if err == nil && len(role) > 0 && role[0] == "master" {
				return addr, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no failover away from %s: %w", old, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// awaitReady waits until every Sentinel sees the primary up, with one
// replica and two other Sentinels, and the replica acknowledges writes.
func (s *SentinelSet) awaitReady(limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var last string
	for _, sn := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr(), MaxRetries: -1})
		for {
			m, err := c.Master(ctx, s.Name).Result()
			if err == nil && m["flags"] == "master" && m["num-slaves"] == "1" && m["num-other-sentinels"] == "2" {
				break
			}
			last = fmt.Sprintf("Sentinel %s: %v %v", sn.Addr(), m, err)
			select {
			case <-ctx.Done():
				c.Close()
				return fmt.Errorf("Sentinels not ready: %s", last)
			case <-time.After(50 * time.Millisecond):
			}
		}
		c.Close()
	}
	// WAIT counts acknowledgements of its own connection's writes, so the
	// probe writes and waits on one connection.
	c := redis.NewClient(&redis.Options{Addr: s.Primary.Addr(), PoolSize: 1})
	defer c.Close()
	for {
		if c.Set(ctx, "redistest-replica-probe", "1", time.Minute).Err() == nil &&
			c.Wait(ctx, 1, 100*time.Millisecond).Val() == 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the replica never acknowledged a write")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
